"""The README as a new user walks it (issue 63): every code block a user would run is run here, in
one scratch folder, in the README's order; and every built-in method either runs on the quick-start
task with no flag or is refused there in one line, as the README's methods table says.

A command that would run a long job runs with small settings: ``SUBSTITUTED`` maps the README's
exact command to the one run (a README change to such a command no longer matches, and the test
fails until the table follows). Commands not run at all are in ``NOT_RUN``, with why. Any other
command is run as written; one in neither table that is not ``hfl-bench`` fails the test.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import hfl_bench
from hfl_bench.cli import app
from hfl_bench.cli.catalog import quick_start_text
from hfl_bench.config import ConfigError
from hfl_bench.method_api import get_method_class
from hfl_bench.registry import METHODS
from hfl_bench.testing import builtin_names

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", COLUMNS="120", NO_COLOR="1")

# README command (comment stripped) -> the command run instead, and why.
SUBSTITUTED = {
    # 30 rounds take minutes; one round runs every part of the same command
    "hfl-bench run --method crad --task digits": "hfl-bench run --method crad --task digits --rounds 1",
    # the record's hash is the placeholder; the file the run above wrote
    "hfl-bench show runs/digits__crad__<hash>__seed0.json": "hfl-bench show runs/digits__crad__*__seed0.json",
}
# README command (comment stripped) -> why it is not run here.
NOT_RUN = {
    "python3 -m venv .venv && . .venv/bin/activate": "an install step (this test runs in the installed venv)",
    "pip install -e . --extra-index-url https://download.pytorch.org/whl/cpu": "an install step (network)",
    "pip install -e '.[dev]' --extra-index-url https://download.pytorch.org/whl/cpu": "an install step (network)",
    'python -m pytest -q -m "not slow"': "the test suite this test is part of",
    "python -m pytest -q": "the test suite this test is part of",
}


def code_blocks(text: str) -> list[tuple[str, str]]:
    """The README's fenced blocks, (language, body), in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def commands(body: str) -> list[str]:
    """A bash block's commands, one a line, each without its trailing comment."""
    return [c for c in (re.sub(r"\s+#\s.*$", "", line).strip() for line in body.splitlines()) if c]


def _expanded(argv: list[str], cwd: Path) -> list[str]:
    out = []
    for a in argv:
        if "*" in a:
            [match] = glob.glob(a, root_dir=cwd)  # exactly one file: the placeholder's
            a = match
        out.append(a)
    return out


def test_the_tables_name_only_commands_the_readme_has():
    """A stale entry (the README's command changed) fails here, so the tables follow the README."""
    readme = [c for lang, body in code_blocks(README.read_text(encoding="utf-8")) if lang == "bash"
              for c in commands(body)]
    assert set(SUBSTITUTED) <= set(readme), set(SUBSTITUTED) - set(readme)
    assert set(NOT_RUN) <= set(readme), set(NOT_RUN) - set(readme)
    assert [lang for lang, _ in code_blocks(README.read_text(encoding="utf-8"))] == [
        "bash", "bash", "bash", "python", "bash"], "a new kind of block: run it here too"


@pytest.mark.slow  # the CLI as processes and two short runs per method of the snippet (about 40 s)
def test_every_readme_block_runs(tmp_path):
    """In one scratch folder, as a user would: the quick start, then the Python snippet (which
    compares against records the quick start did not write: before issue 63 a traceback)."""
    ran = []
    for lang, body in code_blocks(README.read_text(encoding="utf-8")):
        if lang == "python":
            done = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, env=ENV, capture_output=True,
                                  text=True, timeout=600)
            assert done.returncode == 0, f"the README's Python snippet failed:\n{done.stderr[-3000:]}"
            assert re.search(r"^digits dirichlet .* crad - local: ", done.stdout, re.M), done.stdout
            ran.append("python snippet")
            continue
        for command in commands(body):
            if command in NOT_RUN:
                continue
            command = SUBSTITUTED.get(command, command)
            argv = shlex.split(command)
            assert argv[0] == "hfl-bench", f"README command {command!r} is in neither table: add it"
            done = subprocess.run([sys.executable, "-m", "hfl_bench.cli", *_expanded(argv[1:], tmp_path)],
                                  cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr[-2000:]}"
            ran.append(argv[1])
    assert ran == ["run", "show", "describe", "python snippet"]


# --------------------------------------------------------------------------- every method on digits


@pytest.mark.slow  # one round of every built-in method (about 40 s on one core)
def test_every_builtin_method_runs_on_digits_or_is_refused_as_the_table_says(tmp_path):
    """``hfl-bench run --method M --task digits --rounds 1`` for every built-in M: it runs (a record
    ``ok``) where ``list methods`` says ``runs``, and where it names a flag it is refused in one line
    before training (no record) and exit 2 on the command line."""
    refused = {}
    for name in builtin_names(METHODS):
        says = quick_start_text(get_method_class(name).card)
        out = tmp_path / name
        try:
            record = hfl_bench.run(method=name, task="digits", rounds=1, out=str(out))
        except ConfigError as e:
            assert says != "runs", f"{name}: the methods table says it runs on digits, but: {e}"
            assert "\n" not in str(e)
            assert not list(out.glob("*.json")), f"{name}: refused after writing a record"
            refused[name] = says
            continue
        assert says == "runs", f"{name}: runs on digits with no flag, but the table says {says!r}"
        assert record.status == "ok", (name, record.error)
    # the refusals today: the public-set methods, fedavg's one architecture, FedSocket's pretrained bank
    assert refused == {"ds-fl": "needs --public-size 100", "fedcc": "needs --public-size 100",
                       "feddf": "needs --public-size 100", "fedmd": "needs --public-size 100",
                       "msfkd": "needs --public-size 100",
                       "fedavg": "needs --pool cpu-cnn", "fedsocket": "needs --pretrain-size 100",
                       "naive-shared": "needs --pretrain-size 100"}
    for name in refused:  # the command line: one line, exit 2
        result = CliRunner().invoke(app, ["run", "--method", name, "--task", "digits", "--rounds", "1",
                                          "--out", str(tmp_path / "cli")])
        assert result.exit_code == 2, (name, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
        flag = refused[name].split()[1]
        assert flag in result.output, (name, result.output)
