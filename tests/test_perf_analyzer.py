"""perf_analyzer (2.51, from the tritonclient wheel) against qwen3_chat, CI-sized; inputs and parsing."""
from __future__ import annotations

import base64
import json
import struct
import subprocess
import sys

import pytest

from perf_analyzer_configs.runner import inputs, perf_analyzer
from tests.conftest import ROOT, running_server

CSV = """Concurrency,Inferences/Second,Response Throughput,Client Send,Network+Server Send/Recv,Server Queue,\
Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,\
p99 latency,Avg latency,request/response,response wait
1,24.2537,283.328,0,38222,71,28,1976,10,0,39591,45244,48389,52863,40308,0,0
2,39.8819,470.828,0,48066,237,25,793,13,0,49943,59403,61663,80904,49137,0,0
"""


def test_parse_csv():
    rows = perf_analyzer.parse_csv(CSV)
    assert [r["concurrency"] for r in rows] == [1, 2]
    assert rows[1]["throughput_per_s"] == pytest.approx(39.8819)
    assert rows[0]["response_throughput_per_s"] == pytest.approx(283.328)
    assert rows[0]["p99_latency_us"] == 52863 and rows[1]["avg_latency_us"] == 49137


def test_libraries_under_the_names_perf_analyzer_wants():
    folder = perf_analyzer.library_dir()
    for name in ("libb64.so.0d", "libcudart.so.12"):
        assert (folder / name).resolve().is_file()
    out = subprocess.run([str(perf_analyzer.binary()), "--version"], env=perf_analyzer.environment(),
                         capture_output=True, text=True, timeout=60)
    assert "2.51.0" in out.stdout + out.stderr


def test_binary_inputs_use_triton_bytes_serialization():
    b64 = inputs.serialized([b"ab", b"xyz"])
    raw = base64.b64decode(b64["b64"])
    assert raw == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 3) + b"xyz" and b64["shape"] == [2]
    assert inputs.tone_wav()[:4] == b"RIFF"
    data = inputs.input_data("image_generation", overrides=["size=512x512", "num_inference_steps=4"])
    assert all(r["size"] == ["512x512"] and r["num_inference_steps"] == [4] for r in data["data"])
    speech = inputs.input_data("speech", overrides=["size=512x512", "speed=1.5"])
    assert all("size" not in r and r["speed"] == [1.5] for r in speech["data"]), "only inputs the route has"


def test_committed_inputs_are_current():
    """inputs/<model>.json equals what run.py builds for its route (refresh: run.py --write-inputs)."""
    from triton_omni.converters.__main__ import CONFIG_DIR
    from triton_omni.converters.schema import load_ensemble

    committed = sorted((ROOT / "perf_analyzer_configs" / "runner" / "inputs").glob("*.json"))
    assert committed, "no committed input files"
    for path in committed:
        route = load_ensemble(CONFIG_DIR / f"{path.stem}.yaml").openai["route"]
        assert json.loads(path.read_text()) == inputs.input_data(route), f"{path.name} is stale"


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_checkpoints):
    with running_server(tmp_path_factory.mktemp("perf"), ["qwen3_chat", "qwen3_5_chat"],
                        ["qwen3_chat.ar.max_num_seqs=4", "qwen3_5_chat.ar.max_num_seqs=4"]) as s:
        yield s


@pytest.mark.server
def test_perf_analyzer_measures_qwen3_chat(server, tmp_path):
    run = subprocess.run([sys.executable, "-m", "perf_analyzer_configs.runner.run", "--url", server.grpc_url,
                          "--models", "qwen3_chat", "--concurrency", "1", "2", "--measurement-ms", "800",
                          "--max-trials", "3", "--stability", "999", "--max-tokens", "8", "--timeout", "120",
                          "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads((tmp_path / "perf_analyzer.json").read_text())
    rows = result["rows"]
    assert [r["concurrency"] for r in rows] == [1, 2]
    for r in rows:
        assert r["model"] == "qwen3_chat" and r["streaming"] is True
        assert r["throughput_per_s"] > 0 and r["response_throughput_per_s"] > 0 and r["p50_latency_us"] > 0
    assert "--streaming" in result["commands"]["qwen3_chat@1"]
    table = (tmp_path / "perf_analyzer.md").read_text()
    assert "| qwen3_chat | chat | 2 |" in table


@pytest.mark.server
def test_perf_analyzer_measures_qwen3_5_chat(server, tmp_path):
    run = subprocess.run([sys.executable, "-m", "perf_analyzer_configs.runner.run", "--url", server.grpc_url,
                          "--models", "qwen3_5_chat", "--concurrency", "1", "--measurement-ms", "800",
                          "--max-trials", "3", "--stability", "999", "--max-tokens", "8", "--timeout", "120",
                          "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads((tmp_path / "perf_analyzer.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["qwen3_5_chat"] and rows[0]["throughput_per_s"] > 0



def test_windows_by_time_or_by_completed_requests(tmp_path):
    args = ("m", "localhost:8001", tmp_path / "in.json", tmp_path / "out.csv", 2)
    timed = perf_analyzer.command(*args, perf_analyzer.Settings(measurement_ms=800), streaming=True)
    assert timed[timed.index("--measurement-interval") + 1] == "800" and "--measurement-mode" not in timed
    assert "--streaming" in timed
    counted = perf_analyzer.command(*args, perf_analyzer.Settings(measurement_requests=2), streaming=False)
    assert counted[counted.index("--measurement-mode") + 1] == "count_windows"
    assert counted[counted.index("--measurement-request-count") + 1] == "2" and "--streaming" not in counted

def test_engine_trace_summary_lines_up_steps_with_waves():
    from perf_analyzer_configs.trace.engine_trace import summarize_wave

    t0 = 1000.0
    step = lambda dt, kind, rows, tokens=0, arrivals=(): {  # noqa: E731
        "t": t0 + dt, "arrivals": [t0 + a for a in arrivals], "kind": kind, "rows": rows, "tokens": tokens,
        "launch_ms": 0.5, "collect_ms": 1.0}
    steps = [step(-5.0, "decode", 3),                                # before the wave: not counted
             step(0.002, "prefill", 1, 512, [0.001]),
             step(0.004, "decode", 1),
             step(0.006, "prefill", 2, 1024, [0.003, 0.005]),
             *[step(0.008 + 0.002 * i, "decode", 3) for i in range(5)]]
    wave = {"mode": "server", "concurrency": 3, "t0": t0, "wall_s": 0.02, "ttft_ms": [4.0, 8.0, 9.0]}
    text = summarize_wave(wave, steps)
    assert "TTFT min/p50/max 4.0 / 8.0 / 9.0 ms" in text
    assert "3 arrivals at the engine from 1.0 to 5.0 ms" in text
    assert "prefill at     6.0 ms:   2 prompts,   1024 tokens" in text
    assert "decode steps: 1 before the last prefill, 5 after (first at 8.0 ms, step-to-step p50 2.000 ms" in text


def test_triton_trace_summary_per_wave_and_step(tmp_path):
    """Triton's trace (entries written in pieces) grouped into waves; each step's first run per request."""
    from perf_analyzer_configs.trace.triton_trace import load, summarize_wave, waves

    ms = 1_000_000
    entries, next_id = [], [0]

    def trace(model, stamps, parent=None):
        next_id[0] += 1
        head = {"id": next_id[0], "model_name": model, "model_version": 1}
        if parent is not None:
            head["parent_id"] = parent
        entries.append(head)
        entries.extend({"id": next_id[0], "timestamps": [{"name": n, "ns": v}]} for n, v in stamps.items())
        return next_id[0]

    for wave_start in (0, 500 * ms):                       # two waves of three requests each
        for k in range(3):
            t = wave_start + k * ms
            top = trace("ens", {"REQUEST_START": t, "GRPC_SEND_START": t + 40 * ms})
            trace("pre", {"QUEUE_START": t, "COMPUTE_START": t + 2 * ms, "COMPUTE_END": t + 3 * ms}, top)
            for n in (1, 2):                                 # post runs once per streamed response
                trace("post", {"QUEUE_START": t + 30 * ms * n, "COMPUTE_START": t + 30 * ms * n,
                               "COMPUTE_END": t + 30 * ms * n + ms}, top)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(entries))
    traces = load(path)
    found = waves(traces, gap_ms=50)
    assert [len(w) for w in found] == [3, 3]
    text = "\n".join(summarize_wave(traces, found[1]))
    assert "requests start" in text and "0.0 /     1.0 /     2.0" in text
    assert "pre compute_start" in text and "2.0 /     3.0 /     4.0  (3)" in text
    assert "post queue_start" in text and "30.0 /    31.0 /    32.0  (3)" in text     # the first run only
    assert "pre executes: 1x[2.0-3.0] 1x[3.0-4.0] 1x[4.0-5.0]" in text     # one request per execute
    assert "first response sent" in text and "40.0 /    41.0 /    42.0" in text
    assert text.index("pre queue_start") < text.index("post queue_start")


def test_benchmarks_edit_no_sys_path():
    """They run as `python -m perf_analyzer_configs...` and import the installed triton_omni."""
    edits = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "perf_analyzer_configs").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if "sys.path" in line]
    assert not edits, edits


def test_results_page_opens_with_the_current_rows_and_keeps_the_others(tmp_path):
    from perf_analyzer_configs import results

    page = results.Page(title="Toy", module="perf_analyzer_configs.benchmarks.toy",
                        columns=[results.column("mode", "mode", numeric=False), results.column("x", "x", ".1f")],
                        current=lambda r: r["mode"] != "old", order=lambda r: r["x"])
    rows = [{"mode": "new", "x": 2.0}, {"mode": "old", "x": 9.0, "command": "python old.py"}, {"mode": "new", "x": 1.0}]
    data = results.write(tmp_path / "toy.json", page, rows, {"gpu": "G", "versions": {"torch": "1"}}, ["tried: old"],
                         command="python -m toy --fast")
    assert data["commands"] == ["python -m toy --fast", "python old.py"] and len(data["results"]) == 3
    page_md = (tmp_path / "toy.md").read_text()
    assert page_md.startswith("# Toy (G)\n")
    assert "    [1] python -m toy --fast" in page_md and "old.py" not in page_md
    assert page_md.index("| new | 1.0 | 1 |") < page_md.index("| new | 2.0 | 1 |")
    notes = (tmp_path / "toy_notes.md").read_text()
    assert "    [1] python old.py" in notes and "| old | 9.0 | 1 |" in notes and "- tried: old" in notes


@pytest.mark.parametrize("name", ["ar_decode", "decode_matmul", "image", "tts", "tts_codec_calls"])
def test_committed_results_pages_are_generated_from_their_json(tmp_path, name):
    """results/NAME.md (and NAME_notes.md) are what the writer makes of results/NAME.json
    (refresh: python -m perf_analyzer_configs.results)."""
    from perf_analyzer_configs import results

    committed = ROOT / "perf_analyzer_configs" / "results"
    (tmp_path / f"{name}.json").write_text((committed / f"{name}.json").read_text())
    results.render(tmp_path / f"{name}.json", results.page_of(name), json.loads((committed / f"{name}.json").read_text()))
    for page in (f"{name}.md", f"{name}_notes.md"):
        assert (tmp_path / page).exists() == (committed / page).exists(), page
        if (tmp_path / page).exists():
            assert (tmp_path / page).read_text() == (committed / page).read_text(), f"{page} is stale"
