"""Hostile and odd inputs, through the real CLI: YAML alias bombs and deep nesting, keys given twice,
config and suite files that are folders or not UTF-8, a flag given twice, a noise scale that
overflows, devices torch cannot run on here, outputs at or below a file. Each gets one line and
exit 2, quickly, without a traceback and without echoing the file. Then what odd but valid input
does: an empty ``faults:``, YAML anchors of a sane size, merge keys; and files written with the
user's umask. (Image folders: ``tests/test_hostile_images.py``.)"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.config import RunConfig, load_yaml
from hfl_bench.matrix.suite import load_suite
from hfl_bench.paths import write_atomic

REPO = Path(__file__).resolve().parent.parent
DIGITS = REPO / "leaderboards" / "reproduced" / "digits"
RUN = ["run", "--task", "digits", "--clients", "3", "--rounds", "1", "-q"]
SUITE = "methods: [local]\ntasks: [digits]\nseeds: [0]\n"


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """Under 400 bytes that expand to width**levels strings (a "billion laughs"), inside ``rounds``."""
    lines = ["rounds:", "  - &a [" + ", ".join(['"lol"'] * width) + "]"]
    for prev, name in zip("abcdefgh", "bcdefghi"[: levels - 1]):
        lines.append(f"  - &{name} [" + ", ".join([f"*{prev}"] * width) + "]")
    return "\n".join(lines) + "\n"


def suite_bomb() -> str:
    """A suite whose seeds list is an alias bomb."""
    return SUITE.replace("seeds: [0]\n", "seeds:\n" + alias_bomb().split("\n", 1)[1])


def deep(depth: int) -> str:
    return "rounds: " + "[" * depth + "1" + "]" * depth + "\n"


# (case id, arguments after `hfl-bench`, files to write first {name: text or bytes; a name ending
# in / is a folder}, phrases the one line holds)
CASES = [
    ("config-alias-bomb", ["run", "--config", "c.yaml", "-q"], {"c.yaml": alias_bomb()}, ["aliases", "c.yaml"]),
    ("suite-alias-bomb-dry-run", ["matrix", "s.yaml", "--dry-run"], {"s.yaml": suite_bomb()}, ["aliases", "s.yaml"]),
    ("suite-alias-bomb", ["matrix", "s.yaml", "-q"], {"s.yaml": suite_bomb()}, ["aliases"]),
    ("config-recursive-alias", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "rounds: &a [*a, *a]\n"},
     ["aliases"]),
    ("config-nested-too-deep", ["run", "--config", "c.yaml", "-q"], {"c.yaml": deep(400)}, ["nested"]),
    ("config-too-large", ["run", "--config", "c.yaml", "-q"],
     {"c.yaml": "# padding\n" * 120_000 + "rounds: 1\n"}, ["larger than"]),
    ("config-key-twice", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "rounds: 1\nlr: 0.1\nrounds: 2\n"},
     ["'rounds'", "twice", "lines 1 and 3"]),
    ("config-param-twice", ["run", "--config", "c.yaml", "-q"],
     {"c.yaml": "method_params:\n  lam: 0.5\n  lam: 0.6\n"}, ["'lam'", "twice"]),
    ("suite-key-twice", ["matrix", "s.yaml", "--dry-run"], {"s.yaml": SUITE + "seeds: [1]\n"},
     ["'seeds'", "twice"]),
    ("suite-setting-twice", ["matrix", "s.yaml", "--dry-run"],
     {"s.yaml": SUITE + "settings:\n  rounds: 1\n  rounds: 2\n"}, ["'rounds'", "twice"]),
    ("config-is-a-folder", ["run", "--config", "c.yaml", "-q"], {"c.yaml/": ""}, ["c.yaml", "folder"]),
    ("suite-is-a-folder", ["matrix", "s.yaml", "--dry-run"], {"s.yaml/": ""}, ["s.yaml", "folder"]),
    ("config-not-utf8", ["run", "--config", "c.yaml", "-q"], {"c.yaml": b"rounds: 1\n# caf\xe9\n"},
     ["c.yaml", "UTF-8", "line 2"]),
    ("suite-not-utf8", ["matrix", "s.yaml", "--dry-run"], {"s.yaml": SUITE.encode() + b"name: \xff\n"},
     ["s.yaml", "UTF-8"]),
    ("faults-twice", [*RUN, "--faults", "byzantine:0.2", "--faults", "label-noise:0.3"], {},
     ["--faults", "more than once"]),
    ("rounds-twice", [*RUN, "--rounds", "2"], {}, ["--rounds", "more than once"]),
    ("matrix-jobs-twice", ["matrix", "s.yaml", "--dry-run", "-j", "1", "--jobs", "2"], {"s.yaml": SUITE},
     ["--jobs", "more than once"]),
    ("dp-epsilon-denormal", [*RUN, "--method", "crad", "--set", "dp_epsilon=1e-320"], {}, ["dp_epsilon", "1e-320"]),
    ("dp-epsilon-float32-overflow", [*RUN, "--method", "crad", "--set", "dp_epsilon=1e-40"], {}, ["dp_epsilon"]),
    ("device-meta", [*RUN, "--device", "meta"], {}, ["meta", "auto, cpu, cuda or cuda:N"]),
    ("device-mps", [*RUN, "--device", "mps"], {}, ["mps", "auto, cpu, cuda or cuda:N"]),
    ("device-xpu", [*RUN, "--device", "xpu"], {}, ["xpu", "auto, cpu, cuda or cuda:N"]),
    ("device-bogus", [*RUN, "--device", "bogus"], {}, ["bogus", "auto, cpu, cuda or cuda:N"]),
    ("device-cuda-index", [*RUN, "--device", "cuda:99"], {}, ["cuda:99", "valid here: auto, cpu"]),
    ("device-in-config", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "device: meta\n"}, ["meta"]),
    ("plot-out-is-a-file", ["plot", "curves", str(DIGITS), "--out", "f"], {"f": "x"}, ["f", "not a folder"]),
    ("plot-out-below-a-file", ["plot", "curves", str(DIGITS), "--out", "f/sub"], {"f": "x"}, ["f", "not a folder"]),
    ("html-out-is-a-file", ["leaderboard", "html", str(DIGITS), "--out", "f"], {"f": "x"}, ["f", "not a folder"]),
    ("html-out-below-a-file", ["leaderboard", "html", str(DIGITS), "--out", "f/sub/site"], {"f": "x"},
     ["f", "not a folder"]),
]
SLOW_SECONDS = 20  # a refused file is refused at once; the bombs took minutes and gigabytes before


def write_files(folder: Path, files: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if name.endswith("/"):
            (folder / name).mkdir()
        elif isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            (folder / name).write_text(content)


def invoke(args: list[str], folder: Path, monkeypatch):
    monkeypatch.chdir(folder)
    return CliRunner().invoke(app, args, env={"COLUMNS": "200"})


@pytest.mark.parametrize("case,args,files,phrases", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_gets_one_line_and_exit_2(case, args, files, phrases, tmp_path, monkeypatch):
    if case == "device-cuda-index" and torch.cuda.is_available():
        phrases = ["cuda:99", "valid here: auto, cpu, cuda"]
    folder = tmp_path / "case"
    write_files(folder, files)
    out = folder / "out"
    args = [*args, "--out", str(out)] if args[0] in ("run", "matrix") else args
    started = time.monotonic()
    result = invoke(args, folder, monkeypatch)
    elapsed = time.monotonic() - started
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    text = result.stdout + (result.stderr if result.stderr_bytes is not None else "")
    lines = [line for line in text.splitlines() if line.strip()]
    assert result.exit_code == 2, text[-2000:]
    assert "Traceback" not in text and len(lines) == 1, lines[:5]
    assert lines[0].startswith("error:"), lines[0]
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    assert "lol" not in lines[0] and len(lines[0]) < 400  # never the (expanded) document
    assert elapsed < SLOW_SECONDS, elapsed
    assert not out.exists() or not any(out.rglob("*.json"))  # nothing written


def test_the_table_names_each_case_once():
    assert len({c[0] for c in CASES}) == len(CASES)


# --------------------------------------------------------------------------- odd but valid YAML


def test_empty_faults_in_a_config_means_none(tmp_path, monkeypatch):
    (tmp_path / "c.yaml").write_text("faults:\nrounds: 1\n")
    assert load_yaml(tmp_path / "c.yaml")["faults"] == ""
    result = invoke(["run", "--config", "c.yaml", "--task", "digits", "--clients", "3", "-q", "--json",
                     "--out", str(tmp_path / "out")], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    record = json.loads(Path(json.loads(result.stdout)["record"]).read_text())
    assert record["config"]["faults"] == "" and record["status"] == "ok"


def test_empty_faults_in_a_suite_means_none(tmp_path):
    (tmp_path / "s.yaml").write_text(SUITE + "faults:\nsettings:\n  faults:\n")
    suite = load_suite(tmp_path / "s.yaml")
    assert suite.faults == [None] and suite.settings["faults"] == ""
    (tmp_path / "t.yaml").write_text(SUITE + "faults: [~, byzantine:0.2]\n")
    assert load_suite(tmp_path / "t.yaml").faults == ["", "byzantine:0.2/random"]


def test_sane_anchors_and_merge_keys_still_work(tmp_path):
    (tmp_path / "s.yaml").write_text(
        "methods: [local, crad]\ntasks: [digits]\nseeds: [0]\n"
        "method_overrides:\n"
        "  local: &small {rounds: 1, clients: 3}\n"
        "  crad:\n    <<: *small\n    rounds: 2\n")  # a merge key's value overridden: not a key given twice
    suite = load_suite(tmp_path / "s.yaml")
    assert suite.method_overrides == {"local": {"rounds": 1, "clients": 3}, "crad": {"rounds": 2, "clients": 3}}
    (tmp_path / "c.yaml").write_text("method_params: &p {lam: 0.5}\n")
    assert load_yaml(tmp_path / "c.yaml")["method_params"] == {"lam": 0.5}


def test_a_run_config_is_unchanged_by_the_stricter_reader():
    # every committed suite still reads (no key twice, no bomb, UTF-8)
    for path in sorted((REPO / "suites").glob("*.yaml")):
        assert load_suite(path).methods, path


def test_a_single_flag_given_once_is_fine(tmp_path, monkeypatch):
    result = invoke(["partition", "--task", "digits", "--clients", "3", "--json"], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    result = invoke(["partition", "--task", "digits", "--clients", "3", "--clients", "4"], tmp_path, monkeypatch)
    assert result.exit_code == 2 and "--clients" in result.output and "more than once" in result.output


def test_small_dp_epsilon_that_fits_still_runs():
    from hfl_bench.testing import cpu_federation, ready_method

    fed = cpu_federation(RunConfig(task="digits", clients=3, rounds=1, seed=0))
    method = ready_method("crad", fed, dp_epsilon=1e-30)
    assert torch.isfinite(method.shared_counts).all()


# --------------------------------------------------------------------------- the umask


@pytest.fixture
def umask():
    """Set the process umask for the test, restore it after."""
    previous = os.umask(0o022)
    os.umask(previous)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0o002])
def test_atomic_writes_follow_the_umask(mask, tmp_path, umask):
    umask(mask)
    write_atomic(tmp_path / "a.json", "{}")
    write_atomic(tmp_path / "b.bin", lambda f: f.write(b"x"))
    assert mode(tmp_path / "a.json") == mode(tmp_path / "b.bin") == 0o666 & ~mask


def test_records_and_image_caches_follow_the_umask(tmp_path, umask, monkeypatch):
    from test_imagefolder import write_folder

    write_folder(tmp_path / "images", train=(12, 12, 12), test=(4, 4, 4))
    for image in (tmp_path / "images").rglob("*.png"):  # old enough for their content hashes to be cached
        os.utime(image, (time.time() - 60, time.time() - 60))
    umask(0o077)
    out = tmp_path / "out"
    result = invoke(["run", "--task", "imagefolder", "--data-dir", str(tmp_path / "images"), "--method", "local",
                     "--clients", "2", "--rounds", "1", "-q", "--json", "--out", str(out)], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    (record,) = out.glob("*.json")
    (cache,) = (tmp_path / "images" / ".hfl-bench-cache").glob("*.npz")
    (hashes,) = tmp_path.rglob(".hfl-bench-fingerprints.json")
    assert mode(record) == mode(cache) == mode(hashes) == 0o600


def test_checkpoints_follow_the_umask(tmp_path, umask):
    from hfl_bench.engine import Simulation, load_task
    from hfl_bench.testing import QUICK

    _, cfg = load_task(RunConfig(task="digits", method="local", clients=3, rounds=2, seed=0, out=str(tmp_path),
                                 **QUICK))
    sim = Simulation(cfg)
    umask(0o027)
    sim.save_checkpoint(tmp_path / "c.pt")
    assert mode(tmp_path / "c.pt") == 0o640


@pytest.mark.slow  # the CLI as a process
def test_alias_bomb_in_a_real_process(tmp_path):
    """The process boundary too: one line, exit 2, in seconds (before: minutes, then MemoryError)."""
    import subprocess
    import sys

    (tmp_path / "c.yaml").write_text(alias_bomb())
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="200")
    # The bound is the timeout (TimeoutExpired fails the test): a process's start-up (torch's import)
    # alone took 40 s on a loaded 2-core machine, so a tighter wall-clock check measured the load.
    done = subprocess.run([sys.executable, "-m", "hfl_bench.cli", "run", "--config", "c.yaml", "-q"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "aliases" in lines[0], lines[:5]
