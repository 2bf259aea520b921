"""The first ten minutes (issue 14): --version, describe, the hyperparameter table on an unknown
--set key, plain progress lines when piped, --threads in the record, timm imported lazily."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import hfl_bench
from hfl_bench.cli import app

ANSI = re.compile(r"\x1b[\[\]()]")
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", COLUMNS="120")


def cli(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m hfl_bench.cli ARGS`` with stdout and stderr as pipes (not a terminal)."""
    return subprocess.run([sys.executable, "-m", "hfl_bench.cli", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def _stdout(result) -> str:
    return getattr(result, "stdout", result.output)


# --------------------------------------------------------------------------- --version


@pytest.mark.slow  # the CLI as a process
def test_version_fast_path_in_a_subprocess():
    proc = cli("--version", timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == f"hfl-bench {hfl_bench.__version__}"
    # the versions that matter, read from the installed distributions
    from importlib.metadata import version

    assert second.startswith(f"python {sys.version.split()[0]}, torch {version('torch')}, "
                             f"torchvision {version('torchvision')}, timm {version('timm')}, numpy ")


def test_version_through_typer():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert _stdout(result).splitlines()[0] == f"hfl-bench {hfl_bench.__version__}"
    assert "torchvision " in _stdout(result)


def test_flags_show_no_bool_type_in_help():
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "160"})
    assert result.exit_code == 0
    assert "--download" in result.output and "--threads" in result.output
    assert "<bool>" not in result.output


# --------------------------------------------------------------------------- describe


def test_describe_method_lists_hyperparameters():
    result = CliRunner().invoke(app, ["describe", "crad"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    text = _stdout(result)
    lam = next(line for line in text.splitlines() if " lam " in line)
    assert "0.7" in lam and "Distillation weight lambda." in lam
    for needle in ("fidelity", "topology", "citation", "notes", "needs a public set"):
        assert needle in text


def test_describe_method_json():
    result = CliRunner().invoke(app, ["describe", "crad", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(_stdout(result))
    assert info["kind"] == "method" and info["name"] == "crad"
    lam = next(p for p in info["hyperparameters"] if p["name"] == "lam")
    assert lam == {"name": "lam", "type": "float", "default": 0.7, "help": "Distillation weight lambda."}
    assert info["fidelity"] and info["topology"] and isinstance(info["notes"], list)
    assert info["needs_public"] is False


def test_describe_shows_a_methods_changelog():
    # fedcc's card logs 1.1 and 1.2: the terminal lists them oldest first, --json gives the pairs.
    result = CliRunner().invoke(app, ["describe", "fedcc"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = _stdout(result)
    assert "changelog (what each version changed, oldest first):" in text
    first, second = text.index("  - 1.1: The protocol's budget by default"), text.index("  - 1.2: The extra endpoint")
    assert first < second
    info = json.loads(_stdout(CliRunner().invoke(app, ["describe", "fedcc", "--json"])))
    assert [e["version"] for e in info["changelog"]] == ["1.1", "1.2"] == [v for v, _ in
                                                                         _card("fedcc").changelog]
    assert info["changelog"][-1]["version"] == info["version"]
    # A method still at its first version shows no changelog section.
    crad = CliRunner().invoke(app, ["describe", "crad"], env={"COLUMNS": "200"})
    assert "changelog" not in _stdout(crad)
    assert json.loads(_stdout(CliRunner().invoke(app, ["describe", "crad", "--json"])))["changelog"] == []


def _card(name: str):
    from hfl_bench.registry import METHODS

    return METHODS.get(name).card


def test_describe_the_other_kinds():
    runner = CliRunner()
    result = runner.invoke(app, ["describe", "digits"])
    assert result.exit_code == 0, result.output
    assert "version" in result.output and "1x8x8" in result.output
    info = json.loads(_stdout(runner.invoke(app, ["describe", "digits", "--json"])))
    assert info["kind"] == "task" and info["version"] and info["num_classes"] == 10
    assert info["input_shape"] == [1, 8, 8] and "license" in info and "defaults" in info
    pool = json.loads(_stdout(runner.invoke(app, ["describe", "cpu", "--json"])))
    assert [m["model"] for m in pool["members"]] == ["mlp_small", "cnn_small", "resnet_tiny"]
    agg = json.loads(_stdout(runner.invoke(app, ["describe", "crad", "--kind", "aggregators", "--json"])))
    assert agg["kind"] == "aggregator" and agg["description"] and agg["version"] == "1.0"
    fixed = json.loads(_stdout(runner.invoke(app, ["describe", "crad-accuracy", "--json"])))
    assert fixed["version"] == "1.1"
    result = runner.invoke(app, ["describe", "crad-stage1"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "version: 1.0" in result.output and "without the precision weights" in result.output
    part = json.loads(_stdout(runner.invoke(app, ["describe", "dirichlet", "--json"])))
    assert part["kind"] == "partitioner"


def test_describe_unknown_name_is_one_line():
    result = CliRunner().invoke(app, ["describe", "nosuch"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:")
    result = CliRunner().invoke(app, ["describe", "crad", "--kind", "bogus"])
    assert result.exit_code == 2


# --------------------------------------------------------------------------- unknown --set key


@pytest.mark.slow  # the CLI as a process
def test_unknown_set_key_on_a_terminal_prints_the_table(tmp_path):
    """stderr on a pseudo-terminal: the error line, then the method's hyperparameter table."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hfl_bench.cli", "run", "--method", "crad", "--task", "digits",
             "--set", "nosuch=1", "--out", str(tmp_path / "runs")],
            env=dict(ENV, COLUMNS="160"), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=300)
    finally:
        os.close(master)
    text = ANSI.sub("", b"".join(chunks).decode(errors="replace"))
    assert proc.returncode == 2, text
    assert "unknown hyperparameter" in text and "nosuch" in text
    lam = next(line for line in text.splitlines() if " lam " in line)
    assert "0.7" in lam and "Distillation weight" in lam
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("*.json"))


@pytest.mark.slow  # the CLI as a process
def test_unknown_set_key_piped_stays_one_line_naming_describe(tmp_path):
    proc = cli("run", "--method", "crad", "--set", "nosuch=1", "--out", str(tmp_path / "runs"))
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert "unknown hyperparameter" in lines[0] and "hfl-bench describe crad" in lines[0]


# --------------------------------------------------------------------------- progress and threads


@pytest.mark.slow  # the CLI as a process
def test_piped_run_prints_plain_progress_lines_and_records_threads(tmp_path):
    proc = cli("run", "--method", "crad", "--task", "digits", "--rounds", "3", "--clients", "4", "--local-epochs", "1",
               "--threads", "1", "--out", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    progress = [line for line in proc.stderr.splitlines() if "round" in line]
    assert [line.split("round ")[1].split()[0] for line in progress] == ["1/3", "2/3", "3/3"], proc.stderr
    assert all("val " in line and "eta " in line for line in progress)
    assert not ANSI.search(proc.stderr) and not ANSI.search(proc.stdout)
    assert "round 1/3" not in proc.stdout  # progress goes to stderr
    record = json.loads(next((tmp_path / "runs").glob("*.json")).read_text())
    assert record["environment"]["torch_threads"] == 1
    # the CPU it ran on (two CPUs can round differently): torch's kernel set, and on Linux the model
    # and the vector-instruction flags
    import torch

    env = record["environment"]
    assert env["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    if Path("/proc/cpuinfo").is_file():
        assert env["cpu"] and env["cpu_isa"] and all(f.startswith(("sse4", "avx", "fma", "f16c", "amx"))
                                                     for f in env["cpu_isa"].split())


def test_cpu_info_reads_the_first_processor_and_keeps_only_vector_flags(tmp_path):
    from hfl_bench.provenance import cpu_info

    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nmodel name\t: Test CPU <b>1</b>\nflags\t\t: fpu sse4_2 avx2 fma amx_tile vmx\n\n"
                    "processor\t: 1\nmodel name\t: Other\nflags\t\t: fpu avx512f\n")
    info = cpu_info(fake)
    assert info["cpu"] == "Test CPU <b>1</b>" and info["cpu_isa"] == "amx_tile avx2 fma sse4_2"
    assert cpu_info(tmp_path / "missing")["cpu_isa"] is None


@pytest.mark.slow  # the CLI as a process
def test_json_and_quiet_print_no_progress(tmp_path):
    proc = cli("run", "--task", "digits", "--rounds", "2", "--clients", "4", "--local-epochs", "1", "--json",
               "--out", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)  # stdout is the JSON summary only
    assert "round" not in proc.stderr


def test_threads_flag_in_process_is_recorded_and_restored(tmp_path):
    import torch

    before = torch.get_num_threads()
    result = CliRunner().invoke(app, ["run", "--task", "digits", "--rounds", "1", "--clients", "4",
                                      "--local-epochs", "1",
                                      "--threads", "2",
                                      "--out", str(tmp_path / "runs"), "--json", "-q"])
    assert result.exit_code == 0, result.output
    record = json.loads(Path(json.loads(_stdout(result))["record"]).read_text())
    assert record["environment"]["torch_threads"] == 2
    assert torch.get_num_threads() == before


def test_threads_must_be_positive(tmp_path):
    result = CliRunner().invoke(app, ["run", "--threads", "0", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "--threads must be >= 1" in result.output


def test_auto_threads_rule(monkeypatch):
    from hfl_bench import resolved as run_mod
    from hfl_bench.registry import TASKS

    small, large = "cpu", "paper"  # the pools
    monkeypatch.setattr(run_mod, "idle_cores", lambda: 2)
    assert run_mod.auto_threads(large, TASKS.get("cifar10").info) == 1  # busy machine: one thread
    monkeypatch.setattr(run_mod, "idle_cores", lambda: 64)
    assert run_mod.auto_threads(small, TASKS.get("digits").info) == 1  # small models: one thread
    import torch

    assert run_mod.auto_threads(large, TASKS.get("cifar10").info) == min(64, torch.get_num_threads())


# --------------------------------------------------------------------------- lazy timm


@pytest.mark.slow  # a process
def test_pools_import_without_timm_and_models_still_build():
    code = (
        "import sys\n"
        "import hfl_bench.pools as pools\n"
        "assert 'timm' not in sys.modules, 'timm imported at start-up'\n"
        "assert {'paper', 'cpu', 'cpu-cnn', 'paper-resnet18'} <= set(pools.POOLS.names())\n"
        "from hfl_bench.registry import TASKS\n"
        "info = TASKS.get('digits').info\n"
        "for m in pools.get_pool('cpu').members:\n"
        "    pools.build_model(m, info)\n"
        "import timm\n"
        "assert timm.is_model('cnn_small') and timm.is_model('resnet18_cifar')\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.slow  # a process
def test_a_plain_import_timm_sees_our_models():
    code = ("import sys, hfl_bench.pools\n"
            "assert 'timm' not in sys.modules\n"
            "import timm\n"
            "assert timm.is_model('resnet_tiny')\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code], env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.slow  # a process
def test_listing_methods_does_not_import_timm():
    code = ("import sys\n"
            "from hfl_bench.registry import METHODS, TASKS\n"
            "METHODS.names(); TASKS.names()\n"
            "print(sorted(m for m in ('timm', 'torchvision') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.slow  # a process
@pytest.mark.parametrize("args", [["--help"], ["leaderboard", "--help"], ["matrix", "--help"], ["plot", "--help"]])
def test_help_imports_neither_the_data_stack_nor_the_results_layer(args):
    """--help answers from the Typer app alone: numpy, torch, YAML, the results layer and the matrix
    runner are imported by the commands that use them, not at start-up."""
    heavy = ("numpy", "torch", "timm", "yaml", "hfl_bench.recording", "hfl_bench.record.io", "hfl_bench.matrix.runner")
    code = ("import sys\n"
            f"sys.argv = ['hfl-bench', *{args!r}]\n"
            "from hfl_bench.cli import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"


def test_list_tasks_keeps_the_input_shape_on_one_line():
    result = CliRunner().invoke(app, ["list", "tasks"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    digits = next(line for line in result.output.splitlines() if "digits" in line)
    assert "1x8x8" in digits


@pytest.mark.parametrize("kind", ["pools", "partitioners", "aggregators"])
def test_list_still_works(kind):
    result = CliRunner().invoke(app, ["list", kind, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(_stdout(result))


# --------------------------------------------------------------------------- a GPU-sized run on a CPU (issue 63)


def _pathmnist(root: Path, n=(90, 18, 45)) -> Path:
    """A tiny pathmnist.npz in MedMNIST's format: uint8 N x 28 x 28 x 3 images, N x 1 uint8 labels."""
    import numpy as np

    rng = np.random.default_rng(0)
    arrays = {}
    for split, k in zip(("train", "val", "test"), n):
        arrays[f"{split}_images"] = rng.integers(0, 256, size=(k, 28, 28, 3), dtype=np.uint8)
        arrays[f"{split}_labels"] = (np.arange(k) % 9).reshape(-1, 1).astype(np.uint8)
    root.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(root / "pathmnist.npz", **arrays)
    return root


def test_the_missing_pathmnist_line_says_where_the_file_comes_from_and_what_it_holds(tmp_path):
    result = CliRunner().invoke(app, ["run", "--method", "crad", "--task", "pathmnist", "--data-dir",
                                      str(tmp_path), "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2
    [line] = [x for x in result.output.splitlines() if x.strip()]  # no GPU note before the missing data
    for needle in ("https://zenodo.org/records/10519652/files/pathmnist.npz", "MedMNIST v2", "train_, val_ and "
                   "test_images (uint8, N x 28 x 28 x 3)", "classes 0-8", "--download"):
        assert needle in line, line


def test_gpu_sized_note_names_a_cpu_run_only_for_a_gpu_pool_on_a_cpu(tmp_path):
    from hfl_bench.cli.run import gpu_sized_note
    from hfl_bench.resolved import resolve_run

    data = _pathmnist(tmp_path / "data")

    def cfg(**kw):
        return resolve_run({"method": "crad", "task": "pathmnist", "data_dir": str(data), "device": "cpu",
                            "out": str(tmp_path), **kw}).cfg

    said = gpu_sized_note(cfg())
    assert said and said.startswith("pool paper (resnet18, resnet18-half, cnn6) is sized for a GPU")
    assert "300 rounds" in said and said.endswith("A CPU-sized run of pathmnist: --pool cpu --rounds 30")
    assert "--pool cpu-cnn" in gpu_sized_note(cfg(method="fedavg", pool="paper-resnet18"))
    assert gpu_sized_note(cfg(pool="cpu")) is None  # the smaller protocol says nothing
    assert gpu_sized_note(cfg(device="cuda")) is None
    assert gpu_sized_note(cfg(data_dir=str(tmp_path / "none"))) is None  # the missing data is the one line
    assert gpu_sized_note(resolve_run({"method": "crad", "task": "digits", "out": str(tmp_path)}).cfg) is None


@pytest.mark.slow  # the CLI as a process, two rounds of the paper pool on a tiny file
def test_a_gpu_sized_run_on_a_cpu_says_so_and_estimates_then_goes_on(tmp_path):
    """Before issue 63, pathmnist's 300-round ResNet-18 protocol started on a CPU in silence."""
    data = _pathmnist(tmp_path / "data")
    proc = cli("run", "--method", "local", "--task", "pathmnist", "--data-dir", str(data), "--device", "cpu",
               "--rounds", "2", "--clients", "3", "--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    notes = [x for x in proc.stderr.splitlines() if x.startswith("note:")]
    assert len(notes) == 2, proc.stderr
    assert "sized for a GPU and this run is on the CPU: an estimate of its 2 rounds follows" in notes[0]
    assert notes[0].endswith("A CPU-sized run of pathmnist: --pool cpu --rounds 30")
    assert re.fullmatch(r"note: round 1 took \d+ s with the setup: about \d+ (s|min) for the 2 rounds on this CPU",
                        notes[1]), notes[1]
    assert len(list((tmp_path / "runs").glob("pathmnist__local__*.json"))) == 1  # and it went on to the end


def test_duration_text():
    from hfl_bench.cli.run import duration_text

    assert [duration_text(s) for s in (0.2, 40, 90, 3600 * 5 + 25 * 60)] == ["1 s", "40 s", "2 min", "5 h 25 min"]
