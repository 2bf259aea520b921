"""The results layer reads JSON: `leaderboard show`, `compare`, `claims`, `html` and `transfer` import neither
torch nor any method, pool or engine module, and print the same whatever plugins are installed
(an older record's missing fields come from the frozen table of built-in cards, never the registry)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "torchvision", "timm", "hfl_bench.methods", "hfl_bench.method_api", "hfl_bench.engine",
         "hfl_bench.pools", "hfl_bench.data", "hfl_bench.tasks")
# The commands, on committed folders that hold records of every age (1.0 to 1.7) and a claims file.
COMMANDS = {
    "show": ["show", "leaderboards/archive/first-wave/digits", "leaderboards/reproduced/digits", "--format", "json"],
    "compare": ["compare", "leaderboards/reproduced/digits", "--against", "local", "--json"],
    "claims": ["claims", "leaderboards/claims.yaml", "--paper", "CRAD", "--json"],
    "html": ["html", "--out", "{tmp}/site", "leaderboards/reproduced/mini"],
    "transfer": ["transfer", "leaderboards/reproduced/mini", "--json"],
}
# Run in a fresh interpreter; with ``hide``, the entry points of every hfl_bench group are hidden,
# as if no plugin (nor the built-ins) were installed: a registry lookup would find nothing.
PROBE = """
import importlib.metadata, io, contextlib, json, sys
if {hide}:
    real = importlib.metadata.entry_points
    def entry_points(**kw):
        if str(kw.get("group", "")).startswith("hfl_bench"):
            return importlib.metadata.EntryPoints(())
        return real(**kw)
    importlib.metadata.entry_points = entry_points
sys.argv = ["hfl-bench", "leaderboard", *{args!r}]
from hfl_bench.cli import main
out = io.StringIO()
code = 0
try:
    with contextlib.redirect_stdout(out):
        main()
except SystemExit as e:
    code = e.code or 0
heavy = sorted(m for m in sys.modules if m in {heavy!r} or m.startswith(tuple(h + "." for h in {heavy!r})))
print(json.dumps({{"code": code, "heavy": heavy, "out": out.getvalue()}}))
"""


def _run(args: list[str], hide: bool) -> dict:
    code = PROBE.format(hide=hide, args=args, heavy=HEAVY)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_view_imports_no_torch_nor_any_method_and_ignores_what_is_installed(name, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path / "a")) for a in COMMANDS[name]]
    seen = _run(args, hide=False)
    assert seen["code"] == 0 and seen["heavy"] == [], seen["heavy"]
    hidden = _run([a.replace("{tmp}", str(tmp_path / "b")) for a in COMMANDS[name]], hide=True)
    assert hidden["code"] == 0 and hidden["heavy"] == []
    assert hidden["out"].replace(str(tmp_path / "b"), "T") == seen["out"].replace(str(tmp_path / "a"), "T")
    if name == "html":  # the site itself, page by page
        a, b = tmp_path / "a" / "site", tmp_path / "b" / "site"
        pages = sorted(p.relative_to(a) for p in a.rglob("*.html"))
        assert pages and pages == sorted(p.relative_to(b) for p in b.rglob("*.html"))
        assert all((a / p).read_text() == (b / p).read_text() for p in pages)
