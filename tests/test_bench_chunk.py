"""benchmarks/bench_chunk.py: its table is arithmetic over the result JSON, and the performance
study's chunk table is the script's --table output of the committed result, unedited."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_chunk  # noqa: E402

PAGE = ROOT / "docs" / "studies" / "performance.md"
BLOCK = re.compile(r"<!-- chunk table: python benchmarks/bench_chunk.py --table (?P<out>\S+) -->\n"
                   r"(?P<body>.*?)<!-- end chunk table -->", re.S)


def _row(model, chunk, speed, engine=False, same=True):
    return {"pool": "text", "model": model, "chunk": chunk, "engine_chunk": engine, "samples_per_cpu_s": speed,
            "speed_vs_engine": 1.0, "bit_identical_to_one_call": same}


def test_the_table_reads_the_engine_chunk_the_fastest_and_the_chunks_that_differ():
    report = {"rows": [_row("bigru", 128, 900), _row("bigru", 341, 800, engine=True), _row("bigru", 4096, 500),
                       _row("tcn", 341, 50, engine=True, same=False), _row("tcn", 4096, 60)],
              "whole_runs": {"method": "crad", "task": "rotten-tomatoes", "seed": 0, "rounds": 2,
                             "cpu_s_per_round_ids_as_one_value": 20.0, "cpu_s_per_round_engine": 16.0,
                             "speed_vs_before": 1.25, "models_bit_identical": False}}
    lines = bench_chunk.table(report).splitlines()
    assert lines[2] == "| text | bigru | 341 | 800 | 500 | 128 (900) | none |"
    assert lines[3] == "| text | tcn | 341 | 50 | 60 | 4096 (60) | 341 |"
    assert lines[-1].endswith("20.0 CPU s a round with token ids counted as one value, 16.0 at the engine's width "
                              "(x1.25); every client's model equal bit for bit: no.")


def test_the_performance_study_shows_the_committed_chunk_table():
    blocks = list(BLOCK.finditer(PAGE.read_text()))
    assert blocks, "docs/studies/performance.md has no chunk table block"
    for block in blocks:
        result = ROOT / block["out"]
        assert result.resolve().parent == (BENCH / "results").resolve(), block["out"]
        out = subprocess.run([sys.executable, str(BENCH / "bench_chunk.py"), "--table", str(result)],
                             capture_output=True, text=True, check=True).stdout
        assert block["body"] == out, result.name
        report = json.loads(result.read_text())
        assert re.fullmatch(r"[0-9a-f]{7,40}", report["commit"])  # the commit it measured
        text = json.dumps(report)
        assert "/work" not in text and "/home" not in text and "/tmp" not in text  # no machine path
