"""Bad input, through the real CLI: each case exits 2 with one line on stderr and no traceback,
writes nothing, and leaves the records already in ``--out`` untouched.

Every case runs in-process (Typer's CliRunner, the same app the console script runs), and the
cases in ``SUBPROCESS`` also as a fresh ``python -m hfl_bench.cli`` process, the real process
boundary (exit status, stderr, no traceback printed by the interpreter). A subprocess imports
torch, a couple of CPU-seconds each, so only a few cases pay for one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

RUN = ["run", "--task", "digits", "--clients", "4", "--rounds", "1", "-q"]


def run_with(flag: str, value: str) -> list[str]:
    """RUN with its own ``flag`` replaced by ``value`` (a flag given twice is itself refused)."""
    i = RUN.index(flag)
    return [*RUN[:i], *RUN[i + 2:], flag, value]


# (case id, arguments after `hfl-bench`, files to write first {name: text}, a phrase the line holds)
CASES = [
    ("lr-nan", [*RUN, "--lr", "nan"], {}, "finite"),
    ("lr-inf", [*RUN, "--lr", "inf"], {}, "finite"),
    ("lr-negative", [*RUN, "--lr", "-1"], {}, "--lr must be > 0"),
    ("lr-zero", [*RUN, "--lr", "0"], {}, "--lr must be > 0"),
    ("alpha-inf", [*RUN, "--alpha", "inf"], {}, "finite"),
    ("alpha-nan", [*RUN, "--alpha", "nan"], {}, "finite"),
    ("alpha-zero", [*RUN, "--alpha", "0"], {}, "--alpha must be > 0"),
    ("seed-negative", [*RUN, "--seed", "-1"], {}, "--seed must be in [0, 2^63)"),
    ("seed-too-large", [*RUN, "--seed", str(2**63)], {}, "--seed must be in [0, 2^63)"),
    ("rounds-zero", run_with("--rounds", "0"), {}, "--rounds must be >= 1"),
    ("clients-zero", run_with("--clients", "0"), {}, "--clients must be >= 1"),
    ("local-epochs-zero", [*RUN, "--local-epochs", "0"], {}, "--local-epochs must be >= 1"),
    ("batch-size-one", [*RUN, "--batch-size", "1"], {}, "--batch-size must be >= 2"),
    ("eval-every-zero", [*RUN, "--eval-every", "0"], {}, "--eval-every must be >= 1"),
    ("checkpoint-every-negative", [*RUN, "--checkpoint-every", "-1"], {}, "--checkpoint-every must be >= 0"),
    ("public-size-negative", [*RUN, "--public-size", "-5"], {}, "--public-size must be >= 0"),
    ("more-active-than-clients", [*RUN, "--clients-per-round", "5"], {}, "exceeds --clients"),
    ("k-zero", [*RUN, "--partition", "classes", "--k", "0"], {}, "--k"),
    ("exec-unknown", [*RUN, "--exec", "fastest"], {}, "--exec must be"),
    ("cuda-graphs-unknown", [*RUN, "--cuda-graphs", "maybe"], {}, "--cuda-graphs must be"),
    ("param-nan", [*RUN, "--set", "temperature=nan"], {}, "finite"),
    ("param-inf", [*RUN, "--set", "dp_epsilon=inf"], {}, "finite"),
    ("param-not-a-number", [*RUN, "--set", "lam=abc"], {}, "not a valid float"),
    ("param-out-of-range", [*RUN, "--set", "lam=2"], {}, "lam must be in [0, 1]"),
    ("param-unknown", [*RUN, "--set", "nosuch=1"], {}, "unknown hyperparameter"),
    ("param-without-value", [*RUN, "--set", "lam"], {}, "key=value"),
    ("dfml-odd-period", [*RUN, "--method", "dfml", "--set", "period=3"], {}, "period must be an even"),
    ("dfml-eval-unknown", [*RUN, "--method", "dfml", "--set", "eval=best"], {}, "eval must be peak or current"),
    ("dfml-wsm-not-a-bool", [*RUN, "--method", "dfml", "--set", "wsm=maybe"], {}, "dfml: wsm='maybe' is not a valid"),
    ("method-unknown", [*RUN, "--method", "cradd"], {}, "Did you mean 'crad'"),
    ("task-unknown", run_with("--task", "digitz"), {}, "Did you mean 'digits'"),
    ("pool-unknown", [*RUN, "--pool", "nosuch"], {}, "unknown architecture pool"),
    ("partition-unknown", [*RUN, "--partition", "nosuch"], {}, "unknown partitioner"),
    ("device-unknown", [*RUN, "--device", "tpu"], {}, "unknown device"),
    ("needs-public-set", [*RUN, "--method", "fedmd"], {}, "--public-size"),
    ("fedavg-mixed-pool", [*RUN, "--method", "fedavg"], {}, "homogeneous pool"),
    ("too-many-clients", run_with("--clients", "400"), {}, "no validation or local test sample"),
    ("yaml-rounds-list", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "rounds: [1, 2]\n"}, "'rounds' must be"),
    ("yaml-rounds-float", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "rounds: 2.5\n"}, "'rounds' must be"),
    ("yaml-seed-float", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "seed: 1.5\n"}, "'seed' must be"),
    ("yaml-lr-bool", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "lr: true\n"}, "'lr' must be a number"),
    ("yaml-params-list", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "method_params: [1, 2]\n"},
     "method_params"),
    ("yaml-param-nan", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "method_params: {min_support: .nan}\n"},
     "finite"),
    ("yaml-unknown-key", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "roundz: 3\n"}, "unknown setting"),
    # removed settings (config.LEGACY_FIELDS): a record may carry them, a config file may not
    ("yaml-removed-vmap", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "vmap: 'on'\n"}, "unknown setting(s) in"),
    ("yaml-removed-lockstep", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "lockstep: 'on'\n"},
     "unknown setting(s) in"),
    ("yaml-not-a-mapping", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "- 1\n- 2\n"}, "must hold a mapping"),
    ("yaml-invalid", ["run", "--config", "c.yaml", "-q"], {"c.yaml": "rounds: [1,\n"}, "not valid YAML"),
    ("yaml-missing", ["run", "--config", "nosuch.yaml", "-q"], {}, "not found"),
    ("partition-alpha-inf", ["partition", "--alpha", "inf"], {}, "finite"),
    ("partition-clients-zero", ["partition", "--clients", "0"], {}, "--clients must be >= 1"),
]


# Cases also run as a separate process: a value check, a YAML file, a registry name, another command.
SUBPROCESS = ("lr-nan", "yaml-invalid", "method-unknown", "partition-alpha-inf")


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def prepare(args: list[str], files: dict[str, str], folder: Path) -> list[str]:
    """The case's folder (its files and an ``out`` holding an earlier record); its full arguments."""
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    out = folder / "out"
    out.mkdir()
    (out / "earlier.json").write_text('{"schema_version": "1.0", "earlier": true}\n')
    return [*args, "--out", str(out)] if args[0] == "run" else list(args)


def in_process(args: list[str], folder: Path, monkeypatch) -> Outcome:
    from typer.testing import CliRunner

    from hfl_bench.cli import app

    monkeypatch.chdir(folder)  # YAML paths are relative to the working folder
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    try:
        stderr = result.stderr
    except ValueError:  # a runner that mixes stderr into stdout
        stderr = ""
    return Outcome(result.exit_code, result.stdout, stderr)


def as_process(args: list[str], folder: Path) -> Outcome:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", COLUMNS="200")
    done = subprocess.run([sys.executable, "-m", "hfl_bench.cli", *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)
    return Outcome(done.returncode, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def processes(tmp_path_factory) -> tuple[Path, dict[str, Outcome]]:
    """The ``SUBPROCESS`` cases, run concurrently (each process imports torch)."""
    root = tmp_path_factory.mktemp("bad-input-processes")
    cases = {c[0]: c for c in CASES if c[0] in SUBPROCESS}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {case: pool.submit(as_process, prepare(args, files, root / case), root / case)
                   for case, (_, args, files, _) in cases.items()}
    return root, {case: f.result() for case, f in futures.items()}


def test_the_table_is_large_enough():
    assert len({c[0] for c in CASES}) == len(CASES) >= 40
    assert set(SUBPROCESS) <= {c[0] for c in CASES}


def check(outcome: Outcome, phrase: str, folder: Path, files: dict[str, str]) -> None:
    lines = [line for line in (outcome.stdout + outcome.stderr).splitlines() if line.strip()]
    assert outcome.returncode == 2, (outcome.returncode, outcome.stdout, outcome.stderr)
    assert "Traceback" not in outcome.stdout + outcome.stderr
    assert len(lines) == 1, lines
    assert phrase in lines[0], lines[0]
    out = folder / "out"
    assert sorted(p.name for p in out.iterdir()) == ["earlier.json"]  # nothing written, nothing lost
    assert json.loads((out / "earlier.json").read_text()) == {"schema_version": "1.0", "earlier": True}
    assert sorted(p.name for p in folder.iterdir()) == sorted(["out", *files])  # nothing else either


@pytest.mark.parametrize("case,args,files,phrase", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_one_line_and_exit_2(case, args, files, phrase, tmp_path, monkeypatch):
    folder = tmp_path / case
    outcome = in_process(prepare(args, files, folder), folder, monkeypatch)
    check(outcome, phrase, folder, files)


@pytest.mark.slow  # the CLI as processes
@pytest.mark.parametrize("case", SUBPROCESS)
def test_bad_input_in_a_real_process_too(case, processes):
    root, done = processes
    _, _, files, phrase = next(c for c in CASES if c[0] == case)
    check(done[case], phrase, root / case, files)


@pytest.mark.parametrize("flag", ["--vmap", "--lockstep"])
def test_removed_batching_options_are_unknown_options(flag, tmp_path, monkeypatch):
    """``--vmap`` and ``--lockstep`` are gone: the command line refuses them as any unknown option
    (the parser's usage message, which names the option, so not one line), exit 2, nothing written."""
    folder = tmp_path / flag.strip("-")
    outcome = in_process(prepare([*RUN, flag, "on"], {}, folder), folder, monkeypatch)
    text = outcome.stdout + outcome.stderr
    assert outcome.returncode == 2, text
    assert f"No such option: {flag}" in text and "Traceback" not in text
    assert sorted(p.name for p in (folder / "out").iterdir()) == ["earlier.json"]
