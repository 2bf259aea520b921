"""The repository keeps sources, not products, and no file names a folder of the machine that
wrote it: no tracked text file (records included) holds an absolute home, root, work or temporary
path or a Windows drive path, and the built HTML leaderboard (leaderboards/site) is not tracked."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# An absolute path into a machine's home, root, work, mount or temporary folders, or a Windows
# drive path; not preceded by a word character, '.', '~', '/' or '-' (so a URL's path or a
# relative path such as runs/tmp/x does not count).
MACHINE_PATH = re.compile(
    r"(?<![\w.~/-])(?:/(?:home|root|work|tmp|Users|mnt|scratch|var/folders|private/var)/"
    r"|[A-Za-z]:\\\\?(?:Users|Windows|Program Files|Documents and Settings|[\w .-]+\\))")
# Files where such a path documents a pattern rather than naming a folder: none so far.
ALLOWED: set[str] = set()
BUILT = ("leaderboards/site/",)


def tracked_files() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    return [p for p in proc.stdout.decode().split("\0") if p]


def machine_paths(text: str) -> list[str]:
    """The machine paths in ``text``, each with a little context."""
    return [text[max(m.start() - 20, 0):m.end() + 30].replace("\n", " ") for m in MACHINE_PATH.finditer(text)]


def _p(*parts: str) -> str:
    return "/".join(parts)  # built, so this file holds no literal machine path


@pytest.mark.parametrize("text", [
    f'"out": "{_p("", "work", "main", "runs")}"', f"cd {_p('', 'home', 'alice', 'hfl-bench')}",
    f"--out {_p('', 'tmp', 'rt')}", f"REAL = Path('{_p('', 'root', 'data')}')",
    f"open({_p('', 'Users', 'bob', 'x.json')!r})", "C:" + "\\" + "Users" + "\\" + "bob",
    "D:" + "\\" + "data" + "\\" + "mnist",
])
def test_the_pattern_finds_machine_paths(text):
    assert machine_paths(text)


@pytest.mark.parametrize("text", [
    "leaderboards/reproduced/mini", "runs/tmp/x", "~/.cache/hfl-bench/data", "../shared/data/mnist-htfl",
    "https://example.org/home/index.html", "/usr/bin/chromium", '"out": "<out folder>"', "cycles:\\n",
    "a ratio 3:1 of", "$HFL_BENCH_DATA/work/x",
])
def test_the_pattern_leaves_other_text(text):
    assert not machine_paths(text)


@pytest.mark.slow  # git ls-files, then reads every tracked file
def test_no_tracked_file_holds_a_machine_path():
    found = []
    for name in tracked_files():
        path = REPO / name
        if name in ALLOWED or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary (PNG): no text to hold a path
            continue
        found += [f"{name}: ...{hit}..." for hit in machine_paths(data.decode("utf-8", errors="replace"))[:3]]
    assert not found, f"{len(found)} machine paths in tracked files:\n" + "\n".join(found[:40])


def test_built_products_are_not_tracked():
    built = [name for name in tracked_files() if name.startswith(BUILT)]
    assert not built, f"{len(built)} built files tracked, e.g. {built[:3]} (hfl-bench leaderboard html builds them)"
