"""The report answers its question in its first table: the fastest strategy at
the fixed batch and at its max batch kept apart, each with its memory per GPU, the largest
batch; a CPU's memory is '-', an unbounded interval says so, CPU rungs without loader
workers are not each called input-bound. The page is checked as text everywhere, and in
headless Chromium where it is installed."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import write_rung
from scaleladder.cli import main as cli
from scaleladder.figures import report
from scaleladder.results.aggregate import aggregate, read_ladder

CPU = {"gpus_per_node": 0, "device_name": "cpu (x86_64)", "peak_active_gib": 0.0, "peak_reserved_gib": 0.0,
       "alloc_retries": 0}
CAP = {"max_batch": 4, "batch": "4", "maxbatch_capped": True}
FIRST_TABLE = ["model", "nodes", "fastest at the fixed batch", "its peak memory per GPU", "fastest at its max batch",
               "its peak memory per GPU (max batch)", "largest batch", "out of memory"]


def cpu_ladder(root: Path) -> Path:
    """What the local profile's CPU ladder holds, with the numbers of a recorded run:
    DDP at batch 4 (350.6 items/s) and at its max batch, stopped by the cap at 4 (564.9)."""
    files = [
        write_rung(root, "vit-debug/ddp/fp32/pre-lag/n1/b4", items_per_s=350.6, items_per_s_ci_low=300.0,
                   items_per_s_ci_high=400.0, **CPU),
        write_rung(root, "vit-debug/fsdp-full/fp32/pre-lag/n1/b4", items_per_s=290.0, items_per_s_ci_low=250.0,
                   items_per_s_ci_high=math.inf, ci_steps=10, **CPU),
        write_rung(root, "vit-debug/ddp/fp32/pre-lag/n1/bmax", items_per_s=564.9, **CAP, **CPU),
        write_rung(root, "vit-debug/fsdp-full-ac/fp32/pre-lag/n1/bmax", items_per_s=401.0, **CAP, **CPU),
        write_rung(root, "vit-debug/fsdp2-full/fp32/pf0/n1/b4", items_per_s=280.0, input_bound=True,
                   loader_wait_fraction=0.2, loader_workers=0, decode_path="cpu", **CPU),
        write_rung(root, "vit-debug/fsdp2-full-compile/fp32/pf0/n1/b4", items_per_s=200.0, input_bound=True,
                   loader_wait_fraction=0.4, loader_workers=0, decode_path="cpu", **CPU),
    ]
    out = root / "ladder.h5"
    aggregate([str(f) for f in files], str(out))
    return out


class _Tables(HTMLParser):
    """Each <table> of a page as rows of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_the_first_table_keeps_the_fixed_batch_and_the_max_batch_apart(tmp_path: Path) -> None:
    (row,) = report.winners(read_ladder(str(cpu_ladder(tmp_path)))[0])
    assert list(row) == FIRST_TABLE
    # never "fastest: DDP 564.9 items/s, batch 4": the max-batch rung's rate beside the fixed batch
    assert row["fastest at the fixed batch"].startswith("DDP: 350.6 items/s at batch 4; DDP vs FSDP FULL_SHARD")
    assert row["fastest at its max batch"].startswith("DDP: 564.9 items/s at batch ≥4 (cap)")
    assert row["its peak memory per GPU"] == row["its peak memory per GPU (max batch)"] == "-"  # a CPU: not 0
    assert row["largest batch"] == "4 (the search cap: a lower bound): DDP, FSDP FULL_SHARD + AC"  # a tie, not a winner


def test_a_gpu_rung_shows_its_memory_and_an_oom_none(tmp_path: Path) -> None:
    files = [write_rung(tmp_path, "vit-debug/ddp/bf16-mixed/pre-lag/n1/b8", items_per_s=900.0, gpus_per_node=8),
             write_rung(tmp_path, "vit-debug/ddp/bf16-mixed/pre-lag/n1/bmax", items_per_s=1200.0, max_batch=40,
                        batch="40", peak_reserved_gib=37.25, gpus_per_node=8),
             write_rung(tmp_path, "vit-debug/fsdp-full/bf16-mixed/pre-lag/n1/bmax", status="oom")]
    aggregate([str(f) for f in files], str(tmp_path / "l.h5"))
    (row,) = report.winners(read_ladder(str(tmp_path / "l.h5"))[0])
    assert (row["its peak memory per GPU"], row["its peak memory per GPU (max batch)"]) == ("12.0 GiB", "37.2 GiB")
    assert row["fastest at its max batch"] == "DDP: 1,200.0 items/s at batch 40" and row["largest batch"] == "40: DDP"
    assert row["out of memory"] == "FSDP FULL_SHARD"


def test_the_page_first_table_cpu_memory_unbounded_interval_and_input_wait(tmp_path: Path) -> None:
    """The structural checks of the page, without a browser."""
    ladder = cpu_ladder(tmp_path)
    html, md = tmp_path / "report.html", tmp_path / "report.md"
    assert cli(["report", "--ladder", str(ladder), "--plots", str(tmp_path / "plots"), "--html", str(html),
                "--md", str(md)]) == 0
    page = html.read_text()
    parser = _Tables()
    parser.feed(page)
    summary, first, *rest = parser.tables
    assert first[0] == FIRST_TABLE and len(first) == 2
    every = rest[-1]
    head = every[0]
    for col in ("peak reserved GiB", "peak active GiB", "alloc retries"):  # a CPU keeps no allocator peaks
        assert {row[head.index(col)] for row in every[1:]} == {"-"}, col
    assert not re.search(r"\binf\b", page, re.I) and not re.search(r"\binf\b", md.read_text(), re.I)
    assert "[250.0, no upper bound (10 steps)]" in page
    # two CPU rungs with no loader workers waited: said once, without the advice none of them can take
    section = md.read_text().split("## Input-bound rungs")[1].split("##")[0]
    assert section.strip() == ("- 2 rung(s) ran on the CPU with no loader workers and waited for batches (20-40% of "
                               "their step time): expected there, since each rank decodes its own batches on the "
                               "cores it trains on; not listed one by one.")


def test_input_bound_rungs_a_loader_could_help_are_listed_each() -> None:
    base = {"spec": "vit-debug/ddp/fp32/pre-lag/n1/b4", "model": "vit-debug", "status": "ok", "items_per_s": 1.0,
            "input_bound": True, "loader_wait_fraction": 0.1, "decode_path": "cpu"}
    gpu = {**base, "gpus_per_node": 8, "loader_workers": 0}
    cpu_workers = {**base, "spec": "vit-debug/ddp/fp32/pre-lag/n1/b8", "gpus_per_node": 0, "loader_workers": 2}
    lines = report.input_bound([gpu, cpu_workers])
    assert [line.split(":")[0] for line in lines] == [gpu["spec"], cpu_workers["spec"]]
    assert report.input_note([gpu]) == report.INPUT_NOTE and report.input_note([{**base, "gpus_per_node": 0}]) == ""


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.process
@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium here (Debian: apt-get install chromium)")
def test_the_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    """The page as a browser lays it out: a screenshot that is not blank (one Chromium start:
    each costs seconds; the page's structure is checked without a browser above)."""
    ladder = cpu_ladder(tmp_path)
    html = tmp_path / "report.html"
    assert cli(["report", "--ladder", str(ladder), "--plots", str(tmp_path / "plots"), "--html", str(html)]) == 0
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900"]
    shot = tmp_path / "shot.png"
    run = subprocess.run([*flags, f"--screenshot={shot}", html.as_uri()], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", run.stderr[-2000:]
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[:2] == (900, 1280) and pixels.std() > 0.05  # text and tables, not a blank page


def test_a_long_ladder_is_summarised_per_model_and_links_the_table(seed_ladder: tuple[Path, list[Path]],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    root, files = seed_ladder
    out = root / "ladder.h5"
    aggregate([str(f) for f in files], str(out))
    rungs, meta = read_ladder(str(out))
    every = report.render_html(rungs, meta, "plots")
    assert every.count("<tr class='oom'>") > 0 and all(f"<td>{r['spec']}" in every or r["spec"] in every for r in rungs)
    monkeypatch.setattr(report, "EVERY_RUNG_MAX", len(rungs) - 1)
    page, text = report.render_html(rungs, meta, "plots"), report.render_markdown(rungs, meta, "plots")
    assert "<a href='rungs.csv'>rungs.csv</a>" in page and "[rungs.csv](rungs.csv)" in text
    assert f"{len(rungs)} rungs are too many to list here" in page
    section = page[page.index("<h2>Every rung</h2>"):]
    models = sorted({r["model"] for r in rungs})
    assert section.count("<tr>") == 1 + len(models)  # the header and a row per model
    vit3b = [line for line in text.splitlines() if line.startswith("| vit-3b ")][-1]  # the last section's
    assert f"| {sum(r['model'] == 'vit-3b' for r in rungs)} |" in vit3b
    assert len(page) < len(every)


def test_a_long_list_section_counts_what_it_leaves_out() -> None:
    lines = [f"rung {i}" for i in range(report.LIST_MAX + 7)]
    shown = report.capped(lines)
    assert len(shown) == report.LIST_MAX + 1 and shown[-1].startswith("... and 7 more")
    assert report.capped(lines[:3]) == lines[:3]
