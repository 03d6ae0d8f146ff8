"""Check every checkpoint an ensemble names before its repository is written, so a bad folder fails
the build with one line per problem (the ensemble, the file, what is wrong) instead of failing 20 s
into the server's start with a loader's traceback.

What is checked is what the steps' loaders read: each family's config and its supported model type,
the weights, tokenizer and auxiliary files, every safetensors file's header (readable, its tensors
exactly covering the file: a truncated copy is caught), a sharded checkpoint's index against its
shards, and, where our own model classes load the weights (the chat LLMs, Qwen3-TTS, T3, OmniVoice),
every tensor's name and shape against the model built from the config on the meta device (no memory,
no weights read). Which checks apply follows the step that names the checkpoint (FAMILIES).
"""
from __future__ import annotations

import json
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from triton_omni.converters.schema import EnsembleConfig, StepConfig

PROJECT_ROOT = Path(__file__).resolve().parent.parent

Report = list      # of (file, problem) pairs, filled by the checks below


# --- files ------------------------------------------------------------------------------------------
def read_json(path: Path, report: Report, what: str = "") -> dict | None:
    """A JSON object file, or None with the problem reported."""
    if not path.is_file():
        report.append((path, f"missing{what}"))
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        report.append((path, f"not valid JSON: {e}"))
        return None
    if not isinstance(value, dict):
        report.append((path, f"expected a JSON object, got {type(value).__name__}"))
        return None
    return value


def check_torch_file(path: Path, report: Report) -> None:
    """A torch.save file (.pth, .pt, .bin): a zip archive whose directory reads (a truncated copy loses
    the directory at its end), or the legacy pickle format."""
    if not path.is_file():
        report.append((path, "missing"))
        return
    with open(path, "rb") as f:
        if f.read(2) == b"\x80\x02":        # torch.save before torch 1.6: a bare pickle stream
            return
    try:
        with zipfile.ZipFile(path) as z:
            if not any(n.endswith("data.pkl") for n in z.namelist()):
                report.append((path, "a zip archive without data.pkl: not a torch.save file"))
    except (zipfile.BadZipFile, OSError) as e:
        report.append((path, f"not a readable torch.save file ({e}): truncated or corrupt"))


def check_tokenizer(folder: Path, report: Report) -> None:
    """What AutoTokenizer.from_pretrained reads: tokenizer.json, else the slow tokenizers' vocabularies."""
    for name in ("tokenizer_config.json", "tokenizer.json"):
        if (folder / name).exists():
            read_json(folder / name, report)
    if not ((folder / "tokenizer.json").exists() or (folder / "tokenizer.model").exists()
            or (folder / "vocab.txt").exists() or all((folder / n).exists() for n in ("vocab.json", "merges.txt"))):
        report.append((folder / "tokenizer.json", "missing: the folder has no tokenizer "
                                                  "(tokenizer.json, vocab.json + merges.txt, tokenizer.model or vocab.txt)"))


# --- safetensors ------------------------------------------------------------------------------------
# bits per element of each safetensors dtype
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
              "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
              "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
MAX_HEADER = 100 * 1024 * 1024     # safetensors' own limit


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    shape: tuple[int, ...]


def safetensors_header(path: Path, report: Report) -> dict[str, TensorInfo] | None:
    """name -> shape of one safetensors file, read from its header alone; None with the problem
    reported when the header is unreadable or its tensors do not exactly cover the file."""
    if not path.is_file():
        report.append((path, "missing"))
        return None
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            report.append((path, f"truncated: {size} bytes, not even the 8-byte header length"))
            return None
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, MAX_HEADER):
            report.append((path, f"header length {length} exceeds the file's {size - 8} bytes after it: "
                                 "truncated or not safetensors"))
            return None
        raw = f.read(length)
    try:
        header = json.loads(raw)
        assert isinstance(header, dict)
    except (ValueError, AssertionError):
        report.append((path, "corrupt header: not a JSON object"))
        return None
    header.pop("__metadata__", None)
    tensors, spans = {}, []
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], [int(d) for d in entry["shape"]], entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            report.append((path, f"corrupt header: tensor {name!r} lacks dtype, shape or data_offsets"))
            return None
        if dtype not in DTYPE_BITS:
            report.append((path, f"tensor {name!r} has unknown dtype {dtype!r}"))
            return None
        numel = 1
        for d in shape:
            numel *= d
        if min(shape, default=0) < 0 or not 0 <= begin <= end or end - begin != numel * DTYPE_BITS[dtype] // 8:
            report.append((path, f"corrupt header: tensor {name!r} ({dtype} {shape}) has data_offsets {[begin, end]}"))
            return None
        tensors[name] = TensorInfo(path, tuple(shape))
        spans.append((begin, end, name))
    data, at = size - 8 - length, 0
    for begin, end, name in sorted(spans):
        if begin != at:
            report.append((path, f"corrupt header: tensor {name!r} starts at byte {begin} of the data, "
                                 f"expected {at} (a gap or an overlap)"))
            return None
        at = end
    if at != data:
        state = "truncated" if at > data else "longer than its header says"
        report.append((path, f"{state}: its tensors need {at} bytes of data, the file holds {data}"))
        return None
    return tensors


def safetensors_weights(folder: Path, stem: str, report: Report) -> dict[str, TensorInfo] | None:
    """Every tensor of `stem`.safetensors, or of the shards `stem`.safetensors.index.json lists (checked
    against the shards), or of the folder's *.safetensors; None with the problems reported."""
    index = folder / f"{stem}.safetensors.index.json"
    if index.exists():
        raw = read_json(index, report)
        weight_map = raw.get("weight_map") if raw else None
        if raw is not None and not isinstance(weight_map, dict):
            report.append((index, "has no weight_map"))
        if not isinstance(weight_map, dict):
            return None
        shards = {name: safetensors_header(folder / name, report) for name in sorted(set(weight_map.values()))}
        if any(s is None for s in shards.values()):
            return None
        tensors = {}
        for name, held in shards.items():
            tensors.update(held)
            stray = sorted(set(held) - {t for t, s in weight_map.items() if s == name})
            if stray:
                report.append((index, f"weight_map does not list {stray[0]!r}, which shard {name} holds"))
        for tensor, shard in weight_map.items():
            if tensor not in shards[shard]:
                report.append((index, f"weight_map puts {tensor!r} in {shard}, which does not hold it"))
        return tensors
    files = [folder / f"{stem}.safetensors"] if (folder / f"{stem}.safetensors").exists() \
        else sorted(folder.glob("*.safetensors"))
    if not files:
        report.append((folder / f"{stem}.safetensors", f"missing: the folder has no weights "
                                                       f"({stem}.safetensors or {stem}.safetensors.index.json)"))
        return None
    tensors = {}
    for path in files:
        held = safetensors_header(path, report)
        if held is None:
            return None
        tensors.update(held)
    return tensors


# --- tensors against the model ----------------------------------------------------------------------
def check_loads(build: Callable[[], object], folder: Path, tensors: dict[str, TensorInfo], report: Report) -> None:
    """Our loader (models/loader.load_weights) run on the model built on the meta device, fed meta
    tensors of the headers' shapes: every name must have a place, every shape fit, every parameter be
    filled (a tied lm_head may be absent), exactly as at the server's start."""
    import torch

    from triton_omni.models.loader import load_weights

    where = [folder]

    def meta():
        for name, info in tensors.items():
            where[0] = info.file
            yield name, torch.empty(info.shape, device="meta")

    try:
        with torch.device("meta"):
            model = build()
    except Exception as e:      # noqa: BLE001 - whatever the config makes the model class raise
        report.append((folder / "config.json", f"the model cannot be built from it: {type(e).__name__}: {e}"))
        return
    try:
        load_weights(model, folder, meta())
    except (KeyError, ValueError) as e:
        report.append((where[0], str(e.args[0]).removeprefix(f"{folder}: ")))


def check_state_dict(build: Callable[[], object], folder: Path, tensors: dict[str, TensorInfo], report: Report,
                     prefix: str = "", optional: tuple[str, ...] = ()) -> None:
    """For a model loaded with load_state_dict: the module built on the meta device has a tensor of
    the same shape for each of the file's under `prefix`, and the file one for each of its (but
    `optional` ones, buffers the loader computes)."""
    import torch

    with torch.device("meta"):
        own = {k: tuple(v.shape) for k, v in build().state_dict().items()}
    held = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    files = sorted({info.file for info in held.values()}) or [folder]
    for name in sorted(set(own) - set(held)):
        if not name.endswith(optional):
            report.append((files[0], f"lacks tensor {prefix + name!r}, which the config's model has"))
            return
    for name, info in sorted(held.items()):
        if name not in own:
            report.append((info.file, f"tensor {prefix + name!r} has no place in the model"))
            return
        if info.shape != own[name]:
            report.append((info.file, f"tensor {prefix + name!r} has shape {info.shape}; the config makes it {own[name]}"))
            return


# --- the families: what each one's loaders read --------------------------------------------------
def check_config(folder: Path, report: Report, model_types: list[str], key: str = "model_type") -> dict | None:
    config = read_json(folder / "config.json", report)
    if config is not None and config.get(key) not in model_types:
        report.append((folder / "config.json", f"{key} {config.get(key)!r} is not supported here; "
                                               f"supported: {', '.join(model_types)}"))
        return None
    return config


def check_chat(folder: Path, report: Report, weights: bool = True) -> None:
    """A transformers causal LM folder (models/registry.py): our model class fills from its tensors."""
    from triton_omni.models.registry import MODELS, build_causal_lm

    config = check_config(folder, report, sorted(MODELS))
    check_tokenizer(folder, report)
    tensors = safetensors_weights(folder, "model", report) if weights else None
    if config is not None and tensors is not None:
        check_loads(lambda: build_causal_lm(folder, "meta"), folder, tensors, report)


def check_chat_config(folder: Path, report: Report) -> None:
    """What a chat model's pre and post steps read, or its AR step with random weights (load_format:
    dummy): config and tokenizer only."""
    check_chat(folder, report, weights=False)


def check_qwen3_5_vl(folder: Path, report: Report, weights: bool = True) -> None:
    """Qwen3.5 with its vision tower (vision/qwen3_5_vl/): config, tokenizer, the processor's config, and
    the tower's tensors against our tower class (the AR step's check covers the language model's)."""
    from triton_omni.vision.qwen3_5_vl.steps import build_tower

    config = check_config(folder, report, ["qwen3_5"])
    check_tokenizer(folder, report)
    processor = read_json(folder / "preprocessor_config.json", report, " (the image processor's settings)")
    tensors = safetensors_weights(folder, "model", report) if weights else None
    if config is not None and processor is not None and tensors is not None:
        check_loads(lambda: build_tower(folder), folder, tensors, report)


def check_qwen3_omni(folder: Path, report: Report) -> None:
    """Qwen3-Omni (omni/): config, tokenizer, the feature extractor's config, and the thinker's audio tower
    tensors against our tower class (the AR step's check covers the thinker's decoder)."""
    from triton_omni.omni.audio import MODEL_TYPE, Qwen3OmniAudioEncoder

    config = check_config(folder, report, [MODEL_TYPE])
    check_tokenizer(folder, report)
    features = read_json(folder / "preprocessor_config.json", report, " (the feature extractor's settings)")
    tensors = safetensors_weights(folder, "model", report)
    if config is not None and features is not None and tensors is not None:
        check_loads(lambda: Qwen3OmniAudioEncoder.build(folder), folder, tensors, report)


def check_vjepa2(folder: Path, report: Report, weights: bool = True) -> None:
    """A V-JEPA2 folder (vision/vjepa2/): config and the encoder's tensors against our encoder class."""
    from triton_omni.vision.vjepa2.steps import build_encoder

    config = check_config(folder, report, ["vjepa2"])
    tensors = safetensors_weights(folder, "model", report) if weights else None
    if config is not None and tensors is not None:
        check_loads(lambda: build_encoder(folder), folder, tensors, report)


def check_snac(folder: Path, report: Report) -> None:
    read_json(folder / "config.json", report)
    if (folder / "model.safetensors").exists() or not (folder / "pytorch_model.bin").exists():
        safetensors_header(folder / "model.safetensors", report)
    else:
        check_torch_file(folder / "pytorch_model.bin", report)


def check_qwen3_tts(folder: Path, report: Report) -> None:
    from triton_omni.tts.qwen3_tts.model import Qwen3TTS, Qwen3TTSConfig

    config = check_config(folder, report, ["qwen3_tts"])
    check_tokenizer(folder, report)
    tensors = safetensors_weights(folder, "model", report)
    if config is not None and tensors is not None:
        check_loads(lambda: Qwen3TTS(Qwen3TTSConfig.from_folder(folder)), folder, tensors, report)


def check_qwen3_speech_tokenizer(folder: Path, report: Report) -> None:
    """The codec's folder: a release folder's speech_tokenizer/ or that folder itself (codec.load_codec)."""
    from triton_omni.tts.qwen3_tts.codec import Qwen3TTSCodec, read_codec_config

    if not (folder / "config.json").exists() or (folder / "speech_tokenizer" / "config.json").exists():
        folder = folder / "speech_tokenizer"
    config = read_json(folder / "config.json", report)
    tensors = safetensors_weights(folder, "model", report)
    if config is not None and tensors is not None:
        check_loads(lambda: Qwen3TTSCodec(read_codec_config(folder)), folder, tensors, report)


def check_fish(folder: Path, report: Report) -> None:
    check_config(folder, report, ["fish_qwen3_omni"])
    check_tokenizer(folder, report)
    safetensors_weights(folder, "model", report)


def check_kokoro(folder: Path, report: Report) -> None:
    from triton_omni.tts.kokoro.model import WEIGHTS_FILE

    config = read_json(folder / "config.json", report)
    if config is not None and not isinstance(config.get("vocab"), dict):
        report.append((folder / "config.json", "has no vocab (phoneme -> id)"))
    check_torch_file(folder / WEIGHTS_FILE, report)
    voices = sorted((folder / "voices").glob("*.pt"))
    if not voices:
        report.append((folder / "voices", "missing: no voice packs (voices/<name>.pt)"))
    for path in voices:
        check_torch_file(path, report)


def check_chatterbox(folder: Path, report: Report) -> None:
    from triton_omni.tts.chatterbox.t3 import T3, read_config

    if (folder / "config.json").exists():          # optional: size overrides (the release has none)
        read_json(folder / "config.json", report)
    t3 = safetensors_header(folder / "t3_cfg.safetensors", report)
    for name in ("s3gen.safetensors", "ve.safetensors"):
        safetensors_header(folder / name, report)
    read_json(folder / "tokenizer.json", report)
    check_torch_file(folder / "conds.pt", report)
    if t3 is not None and not report:
        check_state_dict(lambda: T3(read_config(folder).get("t3")), folder, t3, report)


def check_omnivoice(folder: Path, report: Report) -> None:
    from triton_omni.tts.omnivoice.model import OmniVoiceModel

    config = check_config(folder, report, ["omnivoice"])
    check_tokenizer(folder, report)
    tensors = safetensors_weights(folder, "model", report)
    read_json(folder / "audio_tokenizer" / "config.json", report)
    safetensors_header(folder / "audio_tokenizer" / "model.safetensors", report)
    if config is not None and tensors is not None:
        check_state_dict(lambda: OmniVoiceModel(config), folder, tensors, report, optional=("codebook_layer_offsets",))


# tensors a BAGEL step reads sizes from (image/bagel/model.py, steps.py)
BAGEL_TENSORS = {"ema.safetensors": ("vae2llm.weight", "latent_pos_embed.pos_embed"),
                 "ae.safetensors": ("decoder.conv_in.weight",)}


def check_omniasr_ctc(folder: Path, report: Report) -> None:
    """An OmniASRForCTC folder: config (model_type omniasr_ctc), tokenizer, weights that fill our encoder."""
    from triton_omni.asr.omniasr.model import CTCConfig, OmniASRCTC

    config = check_config(folder, report, ["omniasr_ctc"])
    check_tokenizer(folder, report)
    tensors = safetensors_weights(folder, "model", report)
    if config is not None and tensors is not None:
        check_loads(lambda: OmniASRCTC(CTCConfig.from_folder(folder)), folder, tensors, report)


def asr_encoders() -> dict:
    """model_type -> how its audio encoder is built from the folder (the LLM-decoder recognisers)."""
    from triton_omni.asr.higgs_audio.model import HiggsAudioEncoder, HiggsAudioEncoderConfig
    from triton_omni.asr.omniasr.model import AudioEncoderConfig, OmniASRLLMEncoder
    from triton_omni.asr.qwen3_asr.model import Qwen3ASRAudioEncoder, Qwen3ASREncoderConfig

    def omni(folder):
        raw = json.loads((folder / "config.json").read_text())
        return OmniASRLLMEncoder(AudioEncoderConfig.from_dict(raw.get("audio_config") or {}),
                                 int((raw.get("text_config") or {}).get("hidden_size", 4096)))

    def qwen(folder):
        return Qwen3ASRAudioEncoder(Qwen3ASREncoderConfig.from_dict(json.loads((folder / "config.json").read_text())
                                                                     .get("audio_config") or {}))

    return {"omniasr": omni, "qwen3_asr": qwen, "higgs_audio": lambda f: HiggsAudioEncoder(HiggsAudioEncoderConfig.from_folder(f))}


def check_asr(folder: Path, report: Report) -> None:
    """A speech-recognition folder: a CTC model's, or an LLM-decoder model's (config, tokenizer, weights
    that fill both our audio encoder and our decoder)."""
    encoders = asr_encoders()
    config = check_config(folder, report, ["omniasr_ctc", *encoders])
    if config is None:
        return
    if config.get("model_type") == "omniasr_ctc":
        check_omniasr_ctc(folder, report)
        return
    check_chat(folder, report)
    tensors = safetensors_weights(folder, "model", report)
    if tensors is not None:
        check_loads(lambda: encoders[config["model_type"]](folder), folder, tensors, report)


def check_bagel(folder: Path, report: Report) -> None:
    read_json(folder / "llm_config.json", report)
    check_tokenizer(folder, report)
    for name, needed in BAGEL_TENSORS.items():
        tensors = safetensors_header(folder / name, report)
        missing = [t for t in needed if tensors is not None and t not in tensors]
        if missing:
            report.append((folder / name, f"lacks tensor {missing[0]!r}"))


def check_component(folder: Path, name: str, library: str, class_name: str, report: Report) -> None:
    """One subfolder of a diffusers pipeline, as diffusion/checkpoint.py loads it."""
    if not folder.is_dir():
        report.append((folder, f"missing: model_index.json names a {name} component ({library}.{class_name})"))
        return
    if name == "scheduler":
        read_json(folder / "scheduler_config.json", report)
        return
    if name in ("tokenizer", "processor"):
        if name == "processor":
            read_json(folder / "preprocessor_config.json", report)
        check_tokenizer(folder, report)
        return
    config = read_json(folder / "config.json", report)
    if library == "transformers":
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        if config is not None and config.get("model_type") not in CONFIG_MAPPING_NAMES:
            report.append((folder / "config.json", f"model_type {config.get('model_type')!r} is unknown to "
                                                   "the installed transformers"))
    safetensors_weights(folder, "model" if library == "transformers" else "diffusion_pytorch_model", report)


def pipeline(classes: tuple[str, ...], components: tuple[str, ...]) -> Callable[[Path, Report], None]:
    """The check of a diffusers pipeline folder of one of `classes`, with the components its steps load."""
    def check(folder: Path, report: Report) -> None:
        index = read_json(folder / "model_index.json", report, ": not a diffusers pipeline folder")
        if index is None:
            return
        if index.get("_class_name") not in classes:
            report.append((folder / "model_index.json", f"_class_name {index.get('_class_name')!r} is not "
                                                        f"supported here; supported: {', '.join(classes)}"))
        for name in components:
            entry = index.get(name)
            if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
                report.append((folder / "model_index.json", f"names no {name} component ([library, class])"))
                continue
            check_component(folder / name, name, entry[0], entry[1], report)
    return check


DIFFUSERS = ("scheduler", "text_encoder", "tokenizer", "transformer", "vae")


def check_wan(folder: Path, report: Report) -> None:
    """A Wan2.2 pipeline folder; the A14B models' second expert too, where model_index.json names one."""
    pipeline(("WanPipeline", "WanImageToVideoPipeline"), DIFFUSERS)(folder, report)
    index = read_json(folder / "model_index.json", [], "")
    second = (index or {}).get("transformer_2")
    if isinstance(second, list) and len(second) == 2 and all(isinstance(x, str) for x in second):
        check_component(folder / "transformer_2", "transformer_2", second[0], second[1], report)


@dataclass(frozen=True)
class Kind:
    check: Callable[[Path, Report], None]
    default: str = ""      # what an empty value stands for, inside the step's checkpoint ("": nothing)


# the module of a step's class -> its checkpoint parameters -> what they must hold
CHAT = {"checkpoint": Kind(check_chat)}
FAMILIES: dict[str, dict[str, Kind]] = {
    "triton_omni.text.": CHAT,
    "triton_omni.ar.": CHAT,
    "triton_omni.tts.orpheus.": {**CHAT, "codec_checkpoint": Kind(check_snac)},
    "triton_omni.tts.qwen3_tts.": {"checkpoint": Kind(check_qwen3_tts),
                                   "codec_checkpoint": Kind(check_qwen3_speech_tokenizer, "speech_tokenizer")},
    "triton_omni.tts.fish.": {"checkpoint": Kind(check_fish), "codec_checkpoint": Kind(check_torch_file, "codec.pth")},
    "triton_omni.tts.kokoro.": {"checkpoint": Kind(check_kokoro)},
    "triton_omni.tts.chatterbox.": {"checkpoint": Kind(check_chatterbox)},
    "triton_omni.tts.omnivoice.": {"checkpoint": Kind(check_omnivoice)},
    "triton_omni.image.bagel.": {"checkpoint": Kind(check_bagel)},
    "triton_omni.asr.": {"checkpoint": Kind(check_asr)},
    "triton_omni.image.z_image.": {"checkpoint": Kind(pipeline(("ZImagePipeline",), DIFFUSERS))},
    "triton_omni.image.flux2.": {"checkpoint": Kind(pipeline(("Flux2KleinPipeline",), DIFFUSERS))},
    "triton_omni.image.qwen_image.": {"checkpoint": Kind(pipeline(("QwenImageEditPipeline", "QwenImageEditPlusPipeline"),
                                                                  DIFFUSERS + ("processor",)))},
    "triton_omni.image.joyimage.": {"checkpoint": Kind(pipeline(("JoyImageEditPipeline",), DIFFUSERS + ("processor",)))},
    "triton_omni.video.wan.": {"checkpoint": Kind(check_wan)},
    "triton_omni.vision.qwen3_5_vl.": {"checkpoint": Kind(check_qwen3_5_vl)},
    "triton_omni.vision.vjepa2.": {"checkpoint": Kind(check_vjepa2)},
    "triton_omni.omni.": {"checkpoint": Kind(check_qwen3_omni)},
}
# a step that reads configs alone, or serves random weights (load_format dummy): the check without weights
CONFIG_ONLY = {check_chat: check_chat_config, check_qwen3_5_vl: lambda f, r: check_qwen3_5_vl(f, r, weights=False),
               check_vjepa2: lambda f, r: check_vjepa2(f, r, weights=False)}


def exists_only(path: Path, report: Report) -> None:
    """A checkpoint parameter of a step this module does not know: verify() checks that it exists."""


def step_kinds(step: StepConfig) -> dict[str, Kind]:
    module = step.cls.__module__ + "."
    return next((kinds for prefix, kinds in FAMILIES.items() if module.startswith(prefix)), {})


def resolve(value: str) -> Path:
    """As the generated config.pbtxt resolves it: relative paths against the project."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else PROJECT_ROOT / path


def checkpoint_uses(cfg: EnsembleConfig, target: str) -> dict[tuple[Path | None, Callable], str]:
    """(path, check) -> the parameter that names it, for every checkpoint parameter of every step
    (path None: the parameter is empty)."""
    uses: dict[tuple[Path | None, Callable], str] = {}
    for step in cfg.steps:
        params = cfg.resolved_parameters(step, target)
        kinds = step_kinds(step)
        for key, value in params.items():
            if key != "checkpoint" and not key.endswith("_checkpoint"):
                continue
            kind = kinds.get(key, Kind(exists_only))
            if kind.check in CONFIG_ONLY and params.get("load_format", "dummy") == "dummy":
                kind = Kind(CONFIG_ONLY[kind.check])    # a step that reads the tokenizer alone, or serves random weights
            if not value and key != "checkpoint":
                if not kind.default or not params.get("checkpoint"):
                    continue
                value = str(resolve(params["checkpoint"]) / kind.default)
            uses.setdefault((resolve(value) if value else None, kind.check), key)
    # the whole check covers the pre and post steps' part of it
    lighter = {light: full for full, light in CONFIG_ONLY.items()}
    return {(path, check): key for (path, check), key in uses.items()
            if not (check in lighter and (path, lighter[check]) in uses)}


def verify(configs: list[EnsembleConfig], target: str = "cpu") -> list[str]:
    """One line per problem, naming the ensemble (and the parameter, if not `checkpoint`), the file and
    the problem; [] when every checkpoint is sound."""
    lines = []
    for cfg in configs:
        for (path, check), key in checkpoint_uses(cfg, target).items():
            who = cfg.name if key == "checkpoint" else f"{cfg.name} ({key})"
            report: Report = []
            if path is None:
                report.append((cfg.source, f"parameter {key!r} is empty: give the ensemble a checkpoint"))
            elif not path.exists():
                hint = "; build the tiny checkpoints: `triton-omni tiny`" if "tiny" in path.parts else ""
                report.append((path, f"does not exist{hint}"))
            else:
                check(path, report)
            lines += [f"{who}: {file}: {problem}" for file, problem in report]
    return list(dict.fromkeys(lines))       # a folder two parameters name is reported once
