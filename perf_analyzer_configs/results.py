"""The benchmarks' result files, written one way: `results/NAME.json` holds every row (each naming the
command that made it), the run's facts (GPU, versions, settings) and notes; the pages are generated
from it. `results/NAME.md` opens with the table of the rows of the current defaults and the commands
that made them, and a picture of them (`results/NAME.png`, when the page says how to plot it); `results/NAME_notes.md` holds the other rows (retired defaults, variants tried) and
the notes on how the numbers came about. Also: combining the files of a run split in parts.

    python -m perf_analyzer_configs.results                 # regenerate every page (and picture) from its JSON
    python -m perf_analyzer_configs.results ar_decode tts   # some of them
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

RESULTS = Path(__file__).resolve().parent / "results"
# results/NAME.json -> the benchmark whose PAGE renders it
BENCHMARKS = {"ar_decode": "bench_ar_decode", "asr": "bench_asr", "chat_features": "bench_chat_features",
              "decode_matmul": "bench_decode_matmul", "decode_matmul_fp8": "bench_decode_matmul", "image": "bench_image",
              "proxy": "bench_proxy", "tts": "bench_tts", "tts_codec_calls": "bench_qwen3_tts_codec",
              "video": "bench_video", "vision": "bench_vision"}


@dataclass
class Column:
    header: str
    cell: Callable[[dict], str]
    numeric: bool = True             # right-aligned


def column(header: str, key: str, fmt: str = "", numeric: bool = True) -> Column:
    """A row's value at `key`, formatted; empty where the row has none."""
    return Column(header, lambda r: "" if r.get(key) is None else format(r[key], fmt), numeric)


@dataclass
class Plot:
    """How a benchmark's current rows draw: one panel per (y key, axis label) of `panels` (throughput,
    latency), a line per `series(row)` (ours against the baseline) over `x` (concurrency, log 2), one
    row of panels per `facet(row)` (a model, a size). `bars`: the x values are categories instead, each
    panel's series its `bars` [(y key, label)] side by side (rows without a concurrency)."""
    panels: list[tuple[str, str]]
    series: Callable[[dict], str] = lambda r: r.get("mode", "")
    facet: Callable[[dict], str] = lambda r: r.get("model", "")
    x: str = "concurrency"
    x_label: str = "concurrency"
    bars: list[tuple[str, str]] | None = None
    category: Callable[[dict], str] = lambda r: ""


@dataclass
class Page:
    """How a benchmark's JSON reads as Markdown."""
    title: str
    module: str                                       # the benchmark, run as `python -m <module>`
    columns: list[Column]
    intro: Callable[[dict], list[str]] = lambda data: []    # what was measured, after the commands
    after: Callable[[list[dict], dict], list[str]] = lambda rows, data: []   # under the current table
    current: Callable[[dict], bool] = lambda row: True      # a row of the current defaults
    order: Callable[[dict], tuple] | None = None            # of the current table's rows
    plot: Plot | None = None                                # results/NAME.png of the current rows


def this_command() -> str:
    """The command line of this process, as `python -m module args` when it was run that way."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    head = f"python -m {spec.name}" if spec and spec.name != "__main__" else f"python {sys.argv[0]}"
    return " ".join([head, *map(shlex.quote, sys.argv[1:])])


def write(path: Path, page: Page, rows: list[dict], meta: dict, notes=(), date: str | None = None,
          command: str | None = None) -> dict:
    """NAME.json with `rows` (those without a command get this process's), `meta` and `notes`; then its pages."""
    command = command or this_command()
    for r in rows:
        r.setdefault("command", command)
    data = {"commands": list(dict.fromkeys(r["command"] for r in rows)),
            "date": date or datetime.datetime.now().isoformat(timespec="seconds"), **meta,
            "notes": list(notes), "results": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    render(path, page, data)
    return data


def table(page: Page, rows: list[dict], commands: list[str]) -> list[str]:
    """Markdown table of `rows`; the last column numbers each row's command in `commands`."""
    lines = ["| " + " | ".join([c.header for c in page.columns] + ["run"]) + " |",
             "|" + "|".join(["---:" if c.numeric else "---" for c in page.columns] + ["---:"]) + "|"]
    for r in rows:
        cells = [c.cell(r) for c in page.columns] + [str(commands.index(r["command"]) + 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def numbered(commands: list[str]) -> list[str]:
    return [f"    [{i}] {c}" for i, c in enumerate(commands, 1)]


def render(path: Path, page: Page, data: dict) -> None:
    """NAME.md (current rows) and, when there are other rows or notes, NAME_notes.md."""
    rows = data["results"]
    current = [r for r in rows if page.current(r)]
    current = sorted(current, key=page.order) if page.order else current
    others = [r for r in rows if not page.current(r)]
    notes_path = path.with_name(path.stem + "_notes.md")
    versions = ", ".join(f"{k} {v}" for k, v in data.get("versions", {}).items())
    commands = list(dict.fromkeys(r["command"] for r in current))
    lines = [f"# {page.title} ({data.get('gpu', '?')})", "",
             f"Generated from {path.name} by perf_analyzer_configs/results.py; {data['date']}; {versions}.", "",
             f"The rows of the current defaults. Each row's `run` is the command that made it (rerun as "
             f"`python -m {page.module}` with its arguments):", "", *numbered(commands), "",
             *page.intro(data), "", *table(page, current, commands), ""]
    if page.plot is not None and draw(path.with_suffix(".png"), page, current, data):
        lines += [f"![{page.title}]({path.stem}.png)", ""]
    lines += [*page.after(current, data), ""]
    if others or data.get("notes"):
        lines.append(f"Other configurations measured and notes on how these numbers came about: "
                     f"[{notes_path.name}]({notes_path.name}).")
    path.with_suffix(".md").write_text("\n".join(lines).rstrip("\n").replace("\n\n\n", "\n\n") + "\n")
    if not (others or data.get("notes")):
        notes_path.unlink(missing_ok=True)
        return
    out = [f"# {page.title}: other configurations and notes", "",
           f"Generated from {path.name} with [{path.stem}.md]({path.stem}.md), whose table has the current defaults."]
    if others:
        other_commands = list(dict.fromkeys(r["command"] for r in others))
        out += ["", "## Other configurations", "",
                "Retired defaults and variants, as measured (the notes below say what each was):", "",
                *numbered(other_commands), "", *table(page, others, other_commands)]
    if data.get("notes"):
        out += ["", "## Notes", "", *[f"- {n}" for n in data["notes"]]]
    notes_path.write_text("\n".join(out) + "\n")


def draw(png: Path, page: Page, rows: list[dict], data: dict) -> bool:
    """results/NAME.png of `rows` as `page.plot` says; False (and no picture) without matplotlib, which
    a GPU machine may lack: regenerate the pictures elsewhere with `python -m perf_analyzer_configs.results`."""
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: {png.name} not drawn", file=sys.stderr)
        return png.exists()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot = page.plot
    facets = list(dict.fromkeys(plot.facet(r) for r in rows)) or [""]
    fig, axes = plt.subplots(len(facets), len(plot.panels), squeeze=False,
                             figsize=(5.2 * len(plot.panels), 3.6 * len(facets)))
    for i, facet in enumerate(facets):
        mine = [r for r in rows if plot.facet(r) == facet]
        for j, (key, label) in enumerate(plot.panels):
            ax = axes[i][j]
            if plot.bars:
                _bars(ax, plot, mine)
            else:
                for name in dict.fromkeys(plot.series(r) for r in mine):
                    pts = sorted((r[plot.x], r[key]) for r in mine if plot.series(r) == name and r.get(key) is not None)
                    if pts:
                        ax.plot(*zip(*pts), marker="o", label=name)
                ax.set_xscale("log", base=2)
                xs = sorted({r[plot.x] for r in mine if r.get(plot.x) is not None})
                ax.set_xticks(xs, [f"{x:g}" for x in xs])
                ax.minorticks_off()
                ax.set_xlabel(plot.x_label)
            ax.set_ylabel(label if not plot.bars else plot.panels[j][1])
            ax.set_title(f"{facet}: {label}" if facet else label, fontsize=10)
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.suptitle(f"{page.title} ({data.get('gpu', '?')})", fontsize=11)
    fig.tight_layout()
    # no timestamps in the file: a picture regenerated from the same JSON is the same bytes
    fig.savefig(png, dpi=80, metadata={"Software": None})
    plt.close(fig)
    return True


def _bars(ax, plot: Plot, rows: list[dict]) -> None:
    cats = [plot.category(r) for r in rows]
    width = 0.8 / len(plot.bars)
    for k, (key, label) in enumerate(plot.bars):
        ax.bar([i + k * width for i in range(len(rows))], [r.get(key, 0) for r in rows], width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], cats, rotation=45, ha="right", fontsize=7)


def merge_parts(paths: list[Path], key: tuple[str, ...], notes: list[str] | None = None):
    """The parsed files, their rows (a later file's row replaces an earlier one with the same `key`
    fields; each row keeps the command that made it) and their notes followed by `notes`, each once."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    rows: dict[tuple, dict] = {}
    for part in parts:
        for r in part["results"]:
            if part.get("command") or part.get("commands"):
                r.setdefault("command", part.get("command") or part["commands"][0])
            k = tuple(r[f] for f in key)
            rows.pop(k, None)
            rows[k] = r
    merged_notes = list(dict.fromkeys([n for p in parts for n in p.get("notes", [])] + list(notes or [])))
    return parts, list(rows.values()), merged_notes


def page_of(name: str) -> Page:
    """The benchmark's PAGE, or the one its PAGES names for this file (a benchmark writing two files)."""
    module = importlib.import_module(f"perf_analyzer_configs.benchmarks.{BENCHMARKS[name]}")
    return getattr(module, "PAGES", {}).get(name, module.PAGE)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"default: all of {', '.join(BENCHMARKS)}")
    ap.add_argument("--dir", type=Path, default=RESULTS, help="the folder of the JSON files")
    args = ap.parse_args()
    unknown = set(args.names) - set(BENCHMARKS)
    if unknown:
        ap.error(f"no benchmark writes {', '.join(sorted(unknown))}")
    for name in args.names or list(BENCHMARKS):
        path = args.dir / f"{name}.json"
        if not path.exists() and not args.names:
            continue                                  # a benchmark not run yet
        render(path, page_of(name), json.loads(path.read_text()))
        print(f"wrote {path.with_suffix('.md')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
