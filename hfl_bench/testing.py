"""Helpers for tests of hfl-bench and of plugin packages (installed with hfl-bench, so a separate
package's own tests can import them).

- ``tiny_federation(task="digits", clients=4, **cfg)``: a federation on the CPU, ready for a
  method's ``setup`` and ``run_round``;
- ``ready_method(cls_or_name, fed, **params)``: a method with these hyperparameters, checked
  against ``fed`` and set up on it;
- ``run_record(*cli_args, out=...)``: ``hfl-bench run ...`` through the real CLI, as a subprocess;
  returns the record it wrote after checking that it is valid;
- ``builtin_names(registry)``: the names hfl-bench itself registered (tests that enumerate a
  registry run on these, so an installed plugin does not change what they check);
- ``builtin_methods()``: the methods the project's suites run, each with ``smoke_config(name)``,
  the ``RunConfig`` fields its card's smoke settings give (``MethodCard.smoke_config``). No test
  keeps a list of methods: a method hfl-bench registers is run by every suite that enumerates
  these.

This module sits above the command line (``run_record`` drives it); nothing in hfl-bench imports it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hfl_bench.config import RunConfig
from hfl_bench.federation import Federation
from hfl_bench.method_api import Method, check_card_setting, get_method_class
from hfl_bench.provenance import is_builtin
from hfl_bench.registry import METHODS, Registry

__all__ = ["builtin_methods", "builtin_names", "cpu_federation", "is_builtin", "ready_method", "run_record",
           "smoke_config", "tiny_federation"]


def builtin_names(registry: Registry) -> list[str]:
    """The sorted names in ``registry`` registered by hfl-bench itself (origin module under
    ``hfl_bench.``); third-party entries are left out."""
    return [name for name in registry.names() if is_builtin(registry, name)]


def builtin_methods() -> list[str]:
    """The sorted names of the methods hfl-bench registered: what the test suites parametrize
    over (pins, faults, evaluation, modalities), each run with ``smoke_config(name)``."""
    return builtin_names(METHODS)


def smoke_config(method: str) -> dict[str, Any]:
    """The ``RunConfig`` fields of a quick run of ``method`` (``method_params``, ``pool``,
    ``public_size``), from its card's smoke settings."""
    return get_method_class(method).card.smoke_config()


def cpu_federation(cfg: RunConfig) -> Federation:
    """The federation ``cfg`` describes (unset fields from the task's defaults), on the CPU."""
    import torch

    from hfl_bench import engine
    from hfl_bench.config import resolve
    from hfl_bench.data import get_task, task_defaults
    from hfl_bench.faults import canonical_config
    from hfl_bench.method_api import method_defaults

    task = get_task(cfg.task)
    cfg = canonical_config(resolve(cfg, {**task_defaults(cfg.task, cfg.data_dir), **method_defaults(cfg.method)}))
    return engine.build_federation(cfg, task.info, task.load(cfg.data_dir), torch.device("cpu"))


# A quick protocol for tests: one local epoch at batch 64 (the tasks' calibrated protocols take
# tens of SGD steps a round, more than a test of a code path needs).
QUICK: dict[str, Any] = {"local_epochs": 1, "batch_size": 64, "lr": 0.01, "heldout_fraction": 0.2}


def tiny_federation(task: str = "digits", clients: int = 4, **cfg: Any) -> Federation:
    """A small federation on the CPU: ``clients`` clients on ``task`` (seed 0, 2 rounds, the
    ``QUICK`` protocol), any other ``RunConfig`` field as a keyword (``pool="cpu-cnn"``,
    ``public_size=100``, ``local_epochs=2``, ...)."""
    values: dict[str, Any] = {"seed": 0, "rounds": 2, **QUICK, **cfg}
    return cpu_federation(RunConfig(task=task, clients=clients, **values))


def ready_method(cls_or_name: type[Method] | str, fed: Federation, **params: Any) -> Method:
    """The method (a class, or its registered name) with these hyperparameters, checked against
    ``fed`` (its card's refusals, then ``check``) and set up on it (``setup``)."""
    cls = get_method_class(cls_or_name) if isinstance(cls_or_name, str) else cls_or_name
    method = cls(cls.Params(**params))
    check_card_setting(cls.card, fed)
    method.check(fed)
    method.setup(fed)
    return method


def run_record(*cli_args: str, out: str | Path | None = None) -> dict[str, Any]:
    """Run ``hfl-bench run CLI_ARGS --out OUT --json -q`` as the command line it is (a
    subprocess of this Python, ``python -m hfl_bench.cli``, so plugins are found through their
    installed entry points), check it exits 0 and that the record it wrote is valid
    (``record.check.problems``), and return the record. ``out`` defaults to a new
    temporary folder. AssertionError otherwise, with the CLI's output or the record's problems."""
    from hfl_bench.record.check import problems as record_problems

    out = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="hfl-bench-test-"))
    command = [sys.executable, "-m", "hfl_bench.cli", "run", *cli_args, "--out", str(out), "--json", "-q"]
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, f"hfl-bench run exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    summary = json.loads(proc.stdout)
    record = json.loads(Path(summary["record"]).read_text(encoding="utf-8"))
    problems = record_problems(record)
    assert not problems, f"invalid record {summary['record']}: {problems}"
    return record
