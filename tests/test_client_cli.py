"""`python -m triton_omni.client ...` against a live tritonserver serving qwen3_chat, and the client's tensors."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from triton_omni.client.chat import ChatClient
from triton_omni.client.tensors import as_array, first, items, text
from tests.conftest import ROOT, running_server

PROMPT = "Write a haiku about the sea."
GREEDY = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("cli"), ["qwen3_chat"], ["qwen3_chat.ar.max_num_seqs=4"]) as s:
        yield s


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "client", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def greedy_args(url: str) -> list[str]:
    return ["chat", "--url", url, "--model", "qwen3_chat", PROMPT, "--max-tokens", "16", "--temperature", "0",
            "--ignore-eos"]


@pytest.mark.server
def test_chat_streams_to_stdout_and_writes_the_file(server, tmp_path):
    want = "".join(c.text for c in ChatClient(server.grpc_url).stream(
        "qwen3_chat", messages=[{"role": "user", "content": PROMPT}], sampling=GREEDY))
    out = tmp_path / "answers" / "chat.txt"
    run = cli(*greedy_args(server.grpc_url), "-o", str(out))
    assert run.returncode == 0, run.stderr
    assert out.read_text() == want and want
    assert run.stdout == want + "\n", "the answer (only) goes to stdout"
    assert "finish_reason=length" in run.stderr and "completion_tokens=16" in run.stderr


@pytest.mark.server
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_chat_over_http_equals_grpc(server, tmp_path, stream):
    grpc_out, http_out = tmp_path / "grpc.txt", tmp_path / "http.txt"
    extra = [] if stream else ["--no-stream"]
    assert cli(*greedy_args(server.grpc_url), "-o", str(grpc_out)).returncode == 0
    run = cli(*greedy_args(f"http://{server.http_url}"), *extra, "-o", str(http_out))
    assert run.returncode == 0, run.stderr
    assert http_out.read_text() == grpc_out.read_text()


@pytest.mark.server
def test_chat_error_is_one_line(server):
    run = cli("chat", "--url", server.grpc_url, "--model", "qwen3_chat", PROMPT, "--max-tokens", "0")
    assert run.returncode == 1
    assert "error:" in run.stderr and "field 'sampling_parameters.max_tokens'" in run.stderr
    assert "Traceback" not in run.stderr


def test_every_task_has_a_subcommand():
    run = cli("--help")
    assert run.returncode == 0
    for task in ("chat", "speech", "transcribe", "image", "edit", "video"):
        assert task in run.stdout
    assert "--steps" in cli("image", "--help").stdout and "--image" in cli("edit", "--help").stdout


def test_tensor_helpers():
    assert as_array({"a": 1}, "BYTES").tolist() == [[b'{"a": 1}']]
    assert as_array([b"x", b"yz"], "BYTES").shape == (1, 2), "a list of bytes is that many items"
    assert as_array(1.5, "FP32").dtype == np.float32 and as_array(1.5, "FP32").shape == (1, 1)
    assert as_array(True, "BOOL").tolist() == [[True]]
    outputs = {"text_output": np.array([b"caf\xc3\xa9"], dtype=np.object_), "n": np.array([3], np.int32),
               "images": np.array([b"a", b"b"], dtype=np.object_)}
    assert text(outputs, "text_output") == "café" and first(outputs, "n") == 3 and isinstance(first(outputs, "n"), int)
    assert items(outputs, "images") == [b"a", b"b"] and first(outputs, "missing", "d") == "d"
