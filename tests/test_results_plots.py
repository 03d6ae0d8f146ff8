"""The shared results writer draws each benchmark's picture beside its table, from its JSON alone."""
from __future__ import annotations

import json

from PIL import Image

from perf_analyzer_configs import results
from perf_analyzer_configs.results import RESULTS, page_of


def test_write_draws_the_current_rows_and_links_the_picture(tmp_path):
    page = results.Page(title="toy", module="toy", columns=[results.column("c", "concurrency")],
                        plot=results.Plot(panels=[("tokens_per_s", "tokens/s"), ("ttft_ms_p50", "TTFT (ms)")]))
    rows = [{"model": m, "mode": mode, "concurrency": c, "tokens_per_s": c * k, "ttft_ms_p50": 5.0 + c}
            for m in ("a", "b") for mode, k in (("ours", 100), ("baseline", 40)) for c in (1, 8, 64)]
    results.write(tmp_path / "toy.json", page, rows, {"gpu": "test"}, command="python -m toy")
    with Image.open(tmp_path / "toy.png") as png:
        assert png.size[0] > 600 and png.size[1] > 400          # 2 models x 2 panels
    assert "![toy](toy.png)" in (tmp_path / "toy.md").read_text()


def test_the_committed_pictures_are_drawn_from_their_json():
    # each benchmark with a plot has its picture, linked from its page
    for name in ("ar_decode", "decode_matmul", "tts", "image"):
        assert page_of(name).plot is not None, name
        assert (RESULTS / f"{name}.png").stat().st_size > 10_000, name
        assert f"({name}.png)" in (RESULTS / f"{name}.md").read_text(), name
        json.loads((RESULTS / f"{name}.json").read_text())
