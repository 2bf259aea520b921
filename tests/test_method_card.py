"""The method card is what the suites read: a method hfl-bench registers, declared by its card
alone, is a case of every suite that runs methods (pins, faults, evaluation, modalities, resume)
without an edit to any test; without a pin its pin test fails; a fault kind its card refuses is
refused by the engine with the card's reason.

The throwaway method is registered through the real registry by a real entry point: a package on
``PYTHONPATH`` beside a ``.dist-info`` that declares it in ``hfl_bench.methods``. Its class says it
lives in ``hfl_bench.methods``, as a new built-in method's module would, so the suites' enumeration
(``hfl_bench.testing.builtin_methods``, which leaves installed plugins out) counts it as one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hfl_bench.registry import METHODS
from hfl_bench.testing import builtin_methods

REPO = Path(__file__).resolve().parent.parent

THROWAWAY = '''
from hfl_bench.method_api import Method, MethodCard, make_plan, register_method, train_students


@register_method
class Throwaway(Method):
    __module__ = "hfl_bench.methods.throwaway"  # what a new module of methods/ would register from
    card = MethodCard(name="throwaway", version="1.0", fidelity="original", topology="none", citation="",
                      summary="Registered by tests/test_method_card.py only.", missing_modalities=True,
                      refuses_faults={"straggler": "a throwaway refuses stragglers"})

    def run_round(self, fed, rnd, active):
        losses = train_students(fed, active, {i: make_plan(fed, i, rnd) for i in active})
        return {"train_loss": sum(losses) / len(losses)}
'''

# The parametrized tests that run every method, and the ids the throwaway must have in each.
PICKED_UP = [
    "tests/test_method_pins.py::test_method_matches_its_pin[throwaway]",
    "tests/test_faults.py::test_every_method_runs_under_every_fault_kind[throwaway-byzantine]",
    "tests/test_faults.py::test_every_method_runs_under_every_fault_kind[throwaway-free-rider]",
    "tests/test_faults.py::test_every_method_runs_under_every_fault_kind[throwaway-straggler]",
    "tests/test_evaluation.py::test_the_default_policy_selects_the_same_round_with_the_same_figures[throwaway]",
    "tests/test_modalities.py::test_every_method_runs_the_task_or_refuses_it_clearly[throwaway]",
    "tests/test_resume.py::test_resumed_run_equals_uninterrupted_run[throwaway]",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder holding the throwaway package and its installed metadata (an entry point)."""
    root = tmp_path_factory.mktemp("throwaway-site")
    (root / "hflb_throwaway").mkdir()
    (root / "hflb_throwaway" / "__init__.py").write_text(THROWAWAY)
    info = root / "hflb_throwaway-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hflb-throwaway\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hfl_bench.methods]\nthrowaway = hflb_throwaway\n")
    (info / "top_level.txt").write_text("hflb_throwaway\n")
    return root


def _pytest(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_the_suites_enumerate_the_registry():
    assert builtin_methods() == sorted(n for n in METHODS.names() if METHODS.origin(n).startswith("hfl_bench."))
    assert "throwaway" not in builtin_methods()  # only the subprocesses below register it


@pytest.mark.slow  # pytest as a process, over every-method suites
def test_a_new_method_is_a_case_of_every_suite_and_fails_without_a_pin(site):
    collected = _pytest(site, "--collect-only", "-q", *sorted({case.split("::")[0] for case in PICKED_UP}))
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-2000:]
    ids = set(collected.stdout.split())
    assert [case for case in PICKED_UP if case not in ids] == []

    # its pin test fails, as does the pin file's check, until HFL_BENCH_UPDATE_PINS=1 writes its pin;
    # the fault kind its card refuses is refused by the engine, with the card's reason
    run = _pytest(site, "-q", "tests/test_method_pins.py::test_method_matches_its_pin[throwaway]",
                  "tests/test_method_pins.py::test_every_case_has_a_pin_and_every_pin_a_case",
                  "tests/test_faults.py::test_every_method_runs_under_every_fault_kind[throwaway-straggler]")
    summary = run.stdout.strip().splitlines()[-1]
    assert "2 failed, 1 passed" in summary, run.stdout[-3000:] + run.stderr[-2000:]
    assert "no pin for throwaway: run with HFL_BENCH_UPDATE_PINS=1" in run.stdout
    assert "FAILED tests/test_faults.py" not in run.stdout
