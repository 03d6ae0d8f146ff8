"""The converter: YAML validation errors, generated configs, the committed repository."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from triton_omni.converters.__main__ import REPO_DIR, load_configs, main
from triton_omni.converters.generate import write_repository
from triton_omni.converters.schema import ConfigError, load_ensemble

GOOD = """\
name: {name}
max_batch_size: 4
checkpoint: checkpoints/tiny/qwen3
outputs: [text_output]
steps:
  - key: pre
    step: chat_pre
  - key: ar
    step: ar_decode
    instances: {{kind: gpu, count: 1}}
    parameters: {{max_num_seqs: {{cpu: 2, gpu: 8}}}}
  - key: post
    step: detokenize
    batching: {{max_queue_delay_us: 100}}
"""


def write(tmp_path: Path, text: str, name: str = "m") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_committed_repository_is_what_the_converter_generates():
    assert main(["check"]) == 0


def test_every_generated_config_parses_and_wires(tmp_path):
    configs = load_configs(None, [], [])
    models = write_repository(configs, tmp_path, "gpu")
    parsed = {m: text_format.Parse((tmp_path / m / "config.pbtxt").read_text(), mc.ModelConfig()) for m in models}
    for name, cfg in parsed.items():
        assert cfg.name == name
        if cfg.platform != "ensemble":
            continue
        known = {t.name for t in cfg.input}
        for step in cfg.ensemble_scheduling.step:
            step_cfg = parsed[step.model_name]
            assert set(step.input_map) <= {t.name for t in step_cfg.input}
            assert set(step.input_map.values()) <= known, f"{name}: {step.model_name} reads an unproduced tensor"
            known |= set(step.output_map.values())
        assert {t.name for t in cfg.output} <= known
    ar = parsed["qwen3_chat_ar"]
    assert ar.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    assert ar.model_transaction_policy.decoupled
    assert ar.parameters["dtype"].string_value == "bfloat16"
    front = parsed["qwen3_chat"]
    assert front.model_transaction_policy.decoupled and front.parameters["ensemble"].string_value == "qwen3_chat_ensemble"
    assert front.instance_group[0].count == 16         # the GPU target's default front processes
    assert parsed["qwen3_chat_pre"].instance_group[0].count == 4    # the YAML's {cpu: 1, gpu: 4}


def test_the_model_clients_call_carries_its_openai_route(tmp_path):
    # the proxy learns routes from Triton's model configs (client/openai_proxy/models.py)
    configs = load_configs(["qwen3_chat", "kokoro_tts"], [], [])
    models = write_repository(configs, tmp_path, "cpu")
    routes = {}
    for m in models:
        params = text_format.Parse((tmp_path / m / "config.pbtxt").read_text(), mc.ModelConfig()).parameters
        if "openai_route" in params:
            routes[m] = (params["openai_route"].string_value, params["openai_description"].string_value)
    described = {c.name: c.description for c in configs}
    assert routes == {   # the streaming model's front, the other's ensemble; never a step
        "qwen3_chat": ("chat", described["qwen3_chat"]), "kokoro_tts": ("speech", described["kokoro_tts"])}


def test_cpu_target_and_overrides(tmp_path):
    write(tmp_path, GOOD.format(name="m"))
    cfg = load_ensemble(tmp_path / "m.yaml")
    from triton_omni.converters.schema import apply_override

    apply_override(cfg, "ar.max_num_seqs", "3")
    apply_override(cfg, "max_model_len", "512")
    write_repository([cfg], tmp_path / "repo", "cpu")
    ar = text_format.Parse((tmp_path / "repo" / "m_ar" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert ar.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert ar.parameters["max_num_seqs"].string_value == "3"
    assert ar.parameters["max_model_len"].string_value == "512"
    pre = text_format.Parse((tmp_path / "repo" / "m_pre" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert pre.parameters["max_model_len"].string_value == "512"
    # outside the project, the relative checkpoint path is written absolute
    assert Path(ar.parameters["checkpoint"].string_value).is_absolute()
    front = text_format.Parse((tmp_path / "repo" / "m" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert front.instance_group[0].count == 1          # the CPU target's default
    assert pre.instance_group[0].count == 1
    apply_override(cfg, "front_instances", "3")
    write_repository([cfg], tmp_path / "repo3", "cpu")
    front = text_format.Parse((tmp_path / "repo3" / "m" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert front.instance_group[0].count == 3


def test_queue_policy_from_the_yaml_and_overrides(tmp_path):
    write(tmp_path, GOOD.format(name="m"))
    cfg = load_ensemble(tmp_path / "m.yaml")
    from triton_omni.converters.schema import apply_override

    post = next(s for s in cfg.steps if s.key == "post")
    assert post.batching is not None and post.batching.max_queue_size == 0       # no bound unless asked
    apply_override(cfg, "post.max_queue_size", "16")
    apply_override(cfg, "post.default_timeout_us", "2000000")
    write_repository([cfg], tmp_path / "repo", "cpu")
    got = text_format.Parse((tmp_path / "repo" / "m_post" / "config.pbtxt").read_text(), mc.ModelConfig())
    policy = got.dynamic_batching.default_queue_policy
    assert (policy.max_queue_size, policy.default_timeout_microseconds) == (16, 2000000)
    assert policy.allow_timeout_override and policy.timeout_action == mc.ModelQueuePolicy.REJECT
    with pytest.raises(ConfigError, match="expected an integer >= 0"):
        apply_override(cfg, "post.max_queue_size", "-1")


BAD = [
    ("unknown top-level key", "name: m\nsteps: []\ncolour: red\n", "m.yaml: colour: unknown key"),
    ("name differs from file", GOOD.format(name="other"), "m.yaml: name: must match the file name"),
    ("no steps", "name: m\nsteps: []\n", "m.yaml: steps: needs at least one step"),
    ("unknown step", "name: m\nsteps:\n  - {key: a, step: nope}\n", "m.yaml: steps.a.step: no step registered as 'nope'"),
    ("bad kind", "name: m\nsteps:\n  - {key: a, step: chat_pre, instances: {kind: tpu}}\n",
     "m.yaml: steps.a.instances.kind: expected cpu or gpu"),
    ("unknown parameter", "name: m\nsteps:\n  - {key: a, step: ar_decode, parameters: {max_seqs: 3}}\n",
     "m.yaml: steps.a.parameters.max_seqs: step 'ar_decode' has no such parameter"),
    ("wrong parameter type", "name: m\nsteps:\n  - {key: a, step: ar_decode, parameters: {max_num_seqs: many}}\n",
     "m.yaml: steps.a.parameters.max_num_seqs: parameter 'max_num_seqs': expected int"),
    ("batching a streaming step", "name: m\nsteps:\n  - {key: a, step: ar_decode, batching: {max_queue_delay_us: 5}}\n",
     "m.yaml: steps.a.batching: a decoupled (streaming) step batches inside its engine"),
    ("negative queue bound", "name: m\nsteps:\n  - {key: a, step: detokenize, batching: {max_queue_size: -2}}\n",
     "m.yaml: steps.a.batching.max_queue_size: expected an integer >= 0"),
    ("not YAML", "name: [m\n", "m.yaml: <yaml>: not valid YAML"),
    ("bad front_instances", "name: m\nfront_instances: {gpu: 0}\nsteps:\n  - {key: a, step: chat_pre}\n",
     "m.yaml: front_instances: expected a positive integer or {cpu: N, gpu: M}"),
    ("bad instance count", "name: m\nsteps:\n  - {key: a, step: chat_pre, instances: {count: {cpu: 1}}}\n",
     "m.yaml: steps.a.instances.count: expected a positive integer or {cpu: N, gpu: M}"),
    ("zero instances", "name: m\nsteps:\n  - {key: a, step: chat_pre, instances: {count: 0}}\n",
     "m.yaml: steps.a.instances.count: expected a positive integer"),
]


@pytest.mark.parametrize("case,text,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_yaml_names_file_key_and_reason(tmp_path, case, text, expect):
    with pytest.raises(ConfigError) as err:
        load_ensemble(write(tmp_path, text))
    assert expect in str(err.value)


def test_output_nobody_produces(tmp_path):
    from triton_omni.converters.generate import wire

    cfg = load_ensemble(write(tmp_path, GOOD.format(name="m").replace("[text_output]", "[audio]")))
    with pytest.raises(ConfigError, match="m.yaml: outputs: no step produces 'audio'"):
        wire(cfg)


def test_cli_reports_config_errors(tmp_path, capsys):
    assert main(["build", "--models", "qwen3_chat", "--set", "qwen3_chat.ar.max_num_seqs=lots",
                 "--out", str(tmp_path)]) == 2
    assert "steps.ar.parameters.max_num_seqs" in capsys.readouterr().err
    assert REPO_DIR.name == "model_repository"
