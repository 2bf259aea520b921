"""benchmarks/cost_growth.py: the grid, the summary and the targets table (no run: the table is
pure arithmetic over the JSON), and the performance study's table is the script's output."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import cost_growth as cg  # noqa: E402

RESULT = BENCH / "results" / "cost-growth-cpu.json"
PAGE = ROOT / "docs" / "studies" / "performance.md"
# a table of the default JSON, or of the one its marker names (a later measurement of some methods)
BLOCK = re.compile(r"<!-- cost-growth table: python benchmarks/cost_growth.py --table(?: --out (?P<out>\S+))? -->\n"
                   r"(?P<body>.*?)<!-- end cost-growth table -->", re.S)


def test_grid_interleaves_n_and_skips_more_active_than_clients():
    grid = cg.configurations(["local", "crad"], [10, 50], [100, 1000, 10])
    assert [(g["method"], g["active"], g["clients"]) for g in grid] == [
        ("local", 10, 100), ("local", 10, 1000), ("local", 10, 10),
        ("crad", 10, 100), ("crad", 10, 1000), ("crad", 10, 10),
        ("local", 50, 100), ("local", 50, 1000), ("crad", 50, 100), ("crad", 50, 1000)]
    assert cg.train_subsample(10) == 500 and cg.train_subsample(100) == 5000
    assert cg.train_subsample(1000) is None  # all 50,000: 50 a client


def _row(method, n, cpu, mem, data=100 * 2**20, error=None):
    rounds = [{"round": 1, "warmup": True, "wall_s": 99.0, "cpu_s": 99.0, "peak_rss_bytes": 9 * 2**30,
               "load_1min": 1.0, "snapshot": True}]
    rounds += [{"round": r, "warmup": False, "wall_s": 2 * c, "cpu_s": c, "peak_rss_bytes": m, "load_1min": 2.0 + r,
                "snapshot": r == 2} for r, (c, m) in enumerate(zip(cpu, mem), 2)]
    row = {"method": method, "clients": n, "active": 10, "images_per_client": 50, "load_1min_start": 1.5,
           "setup": {"wall_s": 5.0, "data_bytes": data}, "rounds": rounds}
    return row | ({"error": error} if error else {})


def test_summary_leaves_out_the_warmup_round():
    s = cg.summary(_row("local", 100, [1.0, 3.0], [2**30, 2 * 2**30]))
    assert s == {"wall_s": 4.0, "cpu_s": 2.0, "peak_rss_bytes": 2 * 2**30, "load": [4.0, 5.0], "rounds": 2,
                 "snapshots": 1, "cpu_s_no_snapshot": 3.0}  # round 3 did not snapshot


def test_targets_table_judges_the_ratios_and_names_failures():
    gib = 2**30
    report = {"rows": [
        _row("local", 100, [1.0, 1.0], [gib, gib]), _row("local", 1000, [1.2, 1.2], [1.2 * gib, 1.2 * gib]),
        _row("fml", 100, [1.0, 1.0], [gib, gib]), _row("fml", 1000, [1.0, 1.0], [2 * gib, 2 * gib]),
        _row("crad", 100, [2.0, 2.0], [gib, gib]), _row("crad", 1000, [20.0, 20.0], [gib, gib]),
        _row("fedsocket", 100, [1.0, 1.0], [gib, gib]),
        # memory grows by its images alone (half a GiB more of them at N = 1,000)
        _row("fedavg", 100, [1.0, 1.0], [gib, gib]),
        _row("fedavg", 1000, [1.0, 1.0], [1.5 * gib, 1.5 * gib], data=100 * 2**20 + gib // 2),
        {**_row("fedsocket", 1000, [], []), "error": "stopped after 900 s (the limit)"},
    ]}
    text = cg.table(report)
    assert "| local | 10 | 1.20x | 1.20x | 1.20x |" in text and text.count("| yes |") == 1
    assert "| fml | 10 | 1.00x | 1.00x | 2.00x | 2.11x | no: memory |" in text
    assert "| fedavg | 10 | 1.00x | 1.00x | 1.50x | 1.00x | no: memory (within less the images) |" in text
    assert "| crad | 10 | 10.00x | 10.00x | 1.00x | 1.00x | no: time |" in text  # judged like the others
    assert "| fedsocket | 10 | 1,000 | 50 | failed: stopped after 900 s (the limit) |" in text
    assert "| fedsocket | 10 | - | - | - | - | not measured at N = 1,000 |" in text
    # CRAD's slope: (20 - 2) / 900 CPU seconds per client
    assert "crad at 10 active: 20.0 CPU s per round per 1,000 more clients" in text


def test_the_performance_study_shows_the_committed_result_table():
    """Each of the study's cost-growth tables is the script's --table output of a committed JSON,
    unedited: the default one first, and any later one its marker names."""
    blocks = list(BLOCK.finditer(PAGE.read_text()))
    assert blocks and blocks[0]["out"] is None, "docs/studies/performance.md has no cost-growth table block"
    for block in blocks:
        result = ROOT / block["out"] if block["out"] else RESULT
        assert result.resolve().parent == RESULT.parent.resolve(), block["out"]
        out = subprocess.run([sys.executable, str(BENCH / "cost_growth.py"), "--table", "--out", str(result)],
                             capture_output=True, text=True, check=True).stdout
        assert block["body"] == out, result.name
        report = json.loads(result.read_text())
        assert report["code"]["git_dirty"] is False  # measured from a clean commit
        assert not [s for s in _strings(report) if s.startswith(("/", "~")) or "/tmp" in s or "/home" in s]


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
