"""`triton-omni build` checks the checkpoints it names (converters/verify.py): a tiny checkpoint copied
into tmp_path and broken fails the build with exit 2 and a line naming the ensemble, the file and the
problem; `--no-verify` builds anyway; the intact copies pass."""
from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from triton_omni.converters.__main__ import main

# ensemble -> the tiny checkpoint its `checkpoint` names
ENSEMBLES = {"qwen3_chat": "qwen3", "qwen3_5_chat": "qwen3_5", "qwen3_moe_chat": "qwen3_moe",
             "qwen3_5_moe_chat": "qwen3_5_moe", "orpheus_tts": "orpheus", "kokoro_tts": "kokoro",
             "qwen3_tts": "qwen3_tts", "qwen3_tts_base": "qwen3_tts_base", "fish_s2_tts": "fish_s2",
             "chatterbox_tts": "chatterbox", "omnivoice_tts": "omnivoice", "z_image_turbo": "z_image_turbo",
             "flux2_klein": "flux2_klein", "qwen_image_edit": "qwen_image_edit",
             "joyai_image_edit": "joyai_image_edit", "bagel": "bagel", "omniasr_ctc": "omniasr_ctc",
             "qwen3_5_vl_chat": "qwen3_5_vl", "vjepa2_embed": "vjepa2", "qwen3_embed": "qwen3_embedding"}


@pytest.fixture
def copy(tiny_checkpoints, tmp_path):
    """A private copy of a tiny checkpoint. Its files are hard links (kokoro's weights are 250 MB), so
    a test breaks a file only through `rewrite`, which replaces the link, never the shared file."""
    def make(name: str) -> Path:
        if name not in tiny_checkpoints:
            pytest.skip(f"tiny checkpoint {name} not built here")
        return Path(shutil.copytree(tiny_checkpoints[name], tmp_path / name, copy_function=os.link))
    return make


def rewrite(path: Path, data: bytes | None) -> None:
    """Replace a file of a copy (None: remove it)."""
    path.unlink()
    if data is not None:
        path.write_bytes(data)


def edit_json(path: Path, **changes) -> None:
    rewrite(path, json.dumps({**json.loads(path.read_text()), **changes}).encode())


def edit_tensors(path: Path, change) -> None:
    tensors = load_file(str(path))
    change(tensors)
    path.unlink()
    save_file(tensors, str(path))


def build(tmp_path: Path, ensemble: str, folder: Path, *extra: str) -> int:
    return main(["build", "--models", ensemble, "--checkpoint", f"{ensemble}={folder}",
                 "--out", str(tmp_path / "repo"), *extra])


def fails(tmp_path, capsys, ensemble: str, folder: Path, file: str, problem: str, parameter: str = "") -> str:
    """The build exits 2, with a line naming the ensemble (and the parameter, if not `checkpoint`), the
    file (relative to `folder`) and the problem."""
    assert build(tmp_path, ensemble, folder) == 2
    err = capsys.readouterr().err
    who = f"{ensemble} ({parameter})" if parameter else ensemble
    assert f"error: {who}: {folder / file}: {problem}" in err, err
    assert not (tmp_path / "repo").exists()
    return err


@pytest.mark.parametrize("ensemble", list(ENSEMBLES))
def test_intact_copies_pass(tmp_path, capsys, copy, ensemble):
    assert build(tmp_path, ensemble, copy(ENSEMBLES[ensemble])) == 0, capsys.readouterr().err
    assert (tmp_path / "repo" / ensemble / "config.pbtxt").exists()


# --- one file removed, cut or edited --------------------------------------------------------------
def remove(file: str):
    return lambda folder: rewrite(folder / file, None)


def truncate(file: str, by: int):
    return lambda folder: rewrite(folder / file, (folder / file).read_bytes()[:-by])


def set_json(file: str, **changes):
    return lambda folder: edit_json(folder / file, **changes)


def garble_header(folder: Path) -> None:
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[8:16] = b"\x00garbage"
    rewrite(folder / "model.safetensors", bytes(data))


def header_past_the_end(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    rewrite(folder / "model.safetensors", struct.pack("<Q", 10 ** 9) + data[8:])


# (case, tiny checkpoint, ensemble, break, file, problem)
BROKEN = [
    ("missing config", "qwen3", "qwen3_chat", remove("config.json"), "config.json", "missing"),
    ("unsupported model_type", "qwen3", "qwen3_chat", set_json("config.json", model_type="gpt2"), "config.json",
     "model_type 'gpt2' is not supported here; supported: higgs_audio, llama, omniasr, qwen3, qwen3_5, qwen3_5_moe, "
     "qwen3_5_moe_text, qwen3_5_text, qwen3_asr, qwen3_moe, qwen3_omni_moe"),
    ("missing weights", "qwen3", "qwen3_chat", remove("model.safetensors"), "model.safetensors",
     "missing: the folder has no weights (model.safetensors or model.safetensors.index.json)"),
    ("truncated safetensors", "qwen3", "qwen3_chat", truncate("model.safetensors", 100), "model.safetensors",
     "truncated: its tensors need "),
    ("corrupt header", "qwen3", "qwen3_chat", garble_header, "model.safetensors", "corrupt header: not a JSON object"),
    ("header length past the end", "qwen3", "qwen3_chat", header_past_the_end, "model.safetensors",
     "header length 1000000000 exceeds the file"),
    ("missing tokenizer file", "qwen3", "qwen3_chat", remove("tokenizer.json"), "tokenizer.json",
     "missing: the folder has no tokenizer"),
    ("pipeline of another class", "z_image_turbo", "z_image_turbo",
     set_json("model_index.json", _class_name="StableDiffusionPipeline"), "model_index.json",
     "_class_name 'StableDiffusionPipeline' is not supported here; supported: ZImagePipeline"),
    ("pipeline component without config", "z_image_turbo", "z_image_turbo", remove("vae/config.json"),
     "vae/config.json", "missing"),
    ("pipeline truncated transformer", "flux2_klein", "flux2_klein",
     truncate("transformer/diffusion_pytorch_model.safetensors", 1), "transformer/diffusion_pytorch_model.safetensors",
     "truncated: "),
    ("pipeline processor without tokenizer", "qwen_image_edit", "qwen_image_edit", remove("processor/tokenizer.json"),
     "processor/tokenizer.json", "missing: the folder has no tokenizer"),
    ("pipeline text encoder of unknown type", "joyai_image_edit", "joyai_image_edit",
     set_json("text_encoder/config.json", model_type="no_such_model"), "text_encoder/config.json",
     "model_type 'no_such_model' is unknown to the installed transformers"),
    ("kokoro config without vocab", "kokoro", "kokoro_tts", set_json("config.json", vocab=None), "config.json",
     "has no vocab"),
    ("bagel without autoencoder", "bagel", "bagel", remove("ae.safetensors"), "ae.safetensors", "missing"),
    ("vision model without its image processor", "qwen3_5_vl", "qwen3_5_vl_chat", remove("preprocessor_config.json"),
     "preprocessor_config.json", "missing (the image processor's settings)"),
    ("video encoder of another type", "vjepa2", "vjepa2_embed", set_json("config.json", model_type="vit"), "config.json",
     "model_type 'vit' is not supported here; supported: vjepa2"),
    ("speech recogniser of another type", "qwen3_asr", "qwen3_asr", set_json("config.json", model_type="whisper"),
     "config.json", "model_type 'whisper' is not supported here; supported: omniasr_ctc, omniasr, qwen3_asr, higgs_audio"),
    ("omni model without its feature extractor", "qwen3_omni", "qwen3_omni", remove("preprocessor_config.json"),
     "preprocessor_config.json", "missing (the feature extractor's settings)"),
    ("Higgs Audio without its audio tower", "higgs_audio", "higgs_audio", set_json("config.json", skip_audio_tower=True),
     "config.json", "the model cannot be built from it: ValueError: "),
]


@pytest.mark.parametrize("case,tiny,ensemble,breaks,file,problem", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_file(tmp_path, capsys, copy, case, tiny, ensemble, breaks, file, problem):
    folder = copy(tiny)
    breaks(folder)
    fails(tmp_path, capsys, ensemble, folder, file, problem)


# --- tensors against the config -----------------------------------------------------------------------
def test_tensor_with_the_wrong_shape(tmp_path, capsys, copy):
    folder = copy("qwen3")
    edit_tensors(folder / "model.safetensors",
                 lambda t: t.update({"model.embed_tokens.weight": t["model.embed_tokens.weight"][:-1].contiguous()}))
    fails(tmp_path, capsys, "qwen3_chat", folder, "model.safetensors",
          "model.embed_tokens.weight: checkpoint shape (515, 64) != model (516, 64)")


def test_missing_layer(tmp_path, capsys, copy):
    folder = copy("qwen3")

    def drop_layer_1(tensors):
        for name in [n for n in tensors if n.startswith("model.layers.1.")]:
            del tensors[name]

    edit_tensors(folder / "model.safetensors", drop_layer_1)
    err = fails(tmp_path, capsys, "qwen3_chat", folder, "model.safetensors", "checkpoint lacks 8 parameter(s)")
    assert "model.layers.1." in err


def test_omni_checkpoint_without_its_audio_tower_layers(tmp_path, capsys, copy):
    folder = copy("qwen3_omni")

    def drop_audio_layer_1(tensors):
        for name in [n for n in tensors if n.startswith("thinker.audio_tower.layers.1.")]:
            del tensors[name]

    edit_tensors(folder / "model.safetensors", drop_audio_layer_1)
    err = fails(tmp_path, capsys, "qwen3_omni", folder, "model.safetensors", "checkpoint lacks")
    assert "audio_tower.layers.1." in err


def test_layer_beyond_the_config(tmp_path, capsys, copy):
    folder = copy("qwen3")
    edit_tensors(folder / "model.safetensors", lambda t: t.update(
        {n.replace("layers.1.", "layers.2."): v.clone() for n, v in t.items() if n.startswith("model.layers.1.")}))
    fails(tmp_path, capsys, "qwen3_chat", folder, "model.safetensors",
          "checkpoint tensor 'model.layers.2.")




def test_missing_folder(tmp_path, capsys):
    fails(tmp_path, capsys, "qwen3_chat", tmp_path / "nowhere", "", "does not exist")


def test_no_verify_builds_anyway(tmp_path, capsys, copy):
    folder = copy("qwen3")
    rewrite(folder / "config.json", None)
    assert build(tmp_path, "qwen3_chat", folder, "--no-verify") == 0
    assert (tmp_path / "repo" / "qwen3_chat_ar" / "config.pbtxt").exists()


def test_random_weights_need_no_weights_file(tmp_path, capsys, copy):
    folder = copy("qwen3")
    rewrite(folder / "model.safetensors", None)
    assert build(tmp_path, "qwen3_chat", folder, "--set", "qwen3_chat.ar.load_format=dummy") == 0, capsys.readouterr().err
    rewrite(folder / "tokenizer.json", None)          # the tokenizer is still read
    shutil.rmtree(tmp_path / "repo")
    assert build(tmp_path, "qwen3_chat", folder, "--set", "qwen3_chat.ar.load_format=dummy") == 2
    assert f"{folder / 'tokenizer.json'}: missing" in capsys.readouterr().err


def test_sharded_checkpoint_index_is_checked_against_its_shards(tmp_path, capsys, copy):
    folder = copy("qwen3")
    tensors = load_file(str(folder / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:10], "model-00002-of-00002.safetensors": names[10:]}
    for shard, held in shards.items():
        save_file({n: tensors[n] for n in held}, str(folder / shard))
    rewrite(folder / "model.safetensors", None)
    weight_map = {n: shard for shard, held in shards.items() for n in held}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert build(tmp_path, "qwen3_chat", folder) == 0, capsys.readouterr().err
    shutil.rmtree(tmp_path / "repo")
    weight_map[names[0]] = "model-00002-of-00002.safetensors"
    rewrite(folder / "model.safetensors.index.json", json.dumps({"weight_map": weight_map}).encode())
    fails(tmp_path, capsys, "qwen3_chat", folder, "model.safetensors.index.json",
          f"weight_map puts {names[0]!r} in model-00002-of-00002.safetensors, which does not hold it")


# --- the other kinds ----------------------------------------------------------------------------------
def test_qwen3_tts_talker_tensor_with_the_wrong_shape(tmp_path, capsys, copy):
    folder = copy("qwen3_tts")
    name = "talker.model.codec_embedding.weight"
    edit_tensors(folder / "model.safetensors", lambda t: t.update({name: t[name][:, :-1].contiguous()}))
    fails(tmp_path, capsys, "qwen3_tts", folder, "model.safetensors", f"{name}: checkpoint shape")


def test_qwen3_tts_truncated_speech_tokenizer(tmp_path, capsys, copy):
    folder = copy("qwen3_tts_base")
    path = folder / "speech_tokenizer" / "model.safetensors"
    rewrite(path, path.read_bytes()[:-8])
    err = fails(tmp_path, capsys, "qwen3_tts_base", folder, "speech_tokenizer/model.safetensors",
                "truncated: ", parameter="codec_checkpoint")
    assert err.count("error: ") == 2          # one problem (once, though two steps name the folder) + the summary


def test_kokoro_truncated_weights(tmp_path, capsys, copy):
    folder = copy("kokoro")
    path = folder / "kokoro-v1_0.pth"
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    rewrite(path, head)
    fails(tmp_path, capsys, "kokoro_tts", folder, "kokoro-v1_0.pth", "not a readable torch.save file")


def test_kokoro_without_voices(tmp_path, capsys, copy):
    folder = copy("kokoro")
    shutil.rmtree(folder / "voices")
    fails(tmp_path, capsys, "kokoro_tts", folder, "voices", "missing: no voice packs")


def test_fish_without_codec(tmp_path, capsys, copy):
    folder = copy("fish_s2")
    rewrite(folder / "codec.pth", None)
    fails(tmp_path, capsys, "fish_s2_tts", folder, "codec.pth", "does not exist", parameter="codec_checkpoint")


def test_chatterbox_t3_tensor_with_the_wrong_shape(tmp_path, capsys, copy):
    folder = copy("chatterbox")
    name = "cond_enc.emotion_adv_fc.weight"
    edit_tensors(folder / "t3_cfg.safetensors", lambda t: t.update({name: torch.zeros(3, 3)}))
    fails(tmp_path, capsys, "chatterbox_tts", folder, "t3_cfg.safetensors", f"tensor {name!r} has shape (3, 3); the config makes it")


def test_omnivoice_missing_tensor(tmp_path, capsys, copy):
    folder = copy("omnivoice")
    edit_tensors(folder / "model.safetensors", lambda t: t.pop("audio_heads.weight"))
    fails(tmp_path, capsys, "omnivoice_tts", folder, "model.safetensors", "lacks tensor 'audio_heads.weight'")


def test_omniasr_ctc_missing_tensor_and_other_model_type(tmp_path, capsys, copy):
    folder = copy("omniasr_ctc")
    edit_tensors(folder / "model.safetensors", lambda t: t.pop("model.audio_tower.layers.1.attention.k_proj.weight"))
    fails(tmp_path, capsys, "omniasr_ctc", folder, "model.safetensors",
          "checkpoint lacks 1 parameter(s), e.g. ['encoder.layers.1.attention.qkv_proj.weight']")
    edit_json(folder / "config.json", model_type="wav2vec2")
    fails(tmp_path, capsys, "omniasr_ctc", folder, "config.json", "model_type 'wav2vec2' is not supported here")


def test_vision_tower_tensor_with_the_wrong_shape(tmp_path, capsys, copy):
    folder = copy("qwen3_5_vl")
    edit_tensors(folder / "model.safetensors",
                 lambda t: t.update({"model.visual.merger.linear_fc2.weight": torch.zeros(3, 3)}))
    fails(tmp_path, capsys, "qwen3_5_vl_chat", folder, "model.safetensors",
          "model.visual.merger.linear_fc2.weight: checkpoint shape (3, 3) != model (64, 128)")
