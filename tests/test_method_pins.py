"""Every built-in method's results at a fixed seed and a small budget, pinned.

A refactor must leave these bit for bit; a change to a method's numerics changes them, and then
the method's ``version`` is bumped and the pin file regenerated in the same commit
(``HFL_BENCH_UPDATE_PINS=1 pytest tests/test_method_pins.py``), with the reason in the commit
message. Each pin holds the method version it was made under: a changed result under the pinned
version fails, and regenerating refuses it too, until the version is bumped. The file lists built-in
methods by name, so an installed plugin method is neither required nor pinned.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hfl_bench import engine
from hfl_bench.results import records
from hfl_bench.config import RunConfig

PIN_FILE = Path(__file__).parent / "pins" / "methods.json"
UPDATE = os.environ.get("HFL_BENCH_UPDATE_PINS") == "1"

BUILTIN = ("crad", "dfml", "fedavg", "fedcc", "fedgd", "fedmd", "fedmkd", "fedsocket", "fml", "local",
           "msfkd", "naive-shared", "uncertainty-kd", "uniform-kd")
# Settings that keep each case to a few seconds while every part of the method runs.
PARAMS = {
    "dfml": {"period": "2"},
    "fedsocket": {"warmup_epochs": "1", "local_epochs": "1"},
    "naive-shared": {"warmup_epochs": "1", "local_epochs": "1"},
    "fedgd": {"g_steps": "2", "synthetic_size": "128"},
    "fedmd": {"transfer_epochs": "1", "private_init_epochs": "1"},
}
POOL = {"fedavg": "cpu-cnn"}
# The optimizer and held-out fraction of the pins, fixed here so that a change of the task's
# protocol defaults (a calibration) does not read as a change of every method's numerics.
PROTOCOL = {"local_epochs": 1, "batch_size": 64, "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4,
            "heldout_fraction": 0.2}
PUBLIC = {"fedcc", "fedmd", "msfkd"}
MULTIMODAL = {"task": "digits-mnist1d", "pool": "cpu-mm"}
# (case name, method, extra config): every method on the default path, and the per-batch
# reference path of the two families that have one.
CASES = [(m, m, {}) for m in BUILTIN] + [
    ("crad@reference", "crad", {"exec": "reference"}),
    ("fedmkd@reference", "fedmkd", {"exec": "reference"}),
    ("uniform-kd@partial", "uniform-kd", {"clients_per_round": 3}),
    # the missing-modality setting: recipients' NaN rows, teachers on them, the multimodal Q
    *[(f"{m}@digits-mnist1d", m, MULTIMODAL) for m in ("crad", "fedsocket", "naive-shared")],
]


GROUPS = ("honest", "faulty", "recipients", "donors")


def pinned_view(record: dict) -> dict:
    """What a run computes, without timing, dates or provenance."""
    # A client group's per-round and final figures (schema 1.5) are views of the same models as the
    # pinned all-client history and selected-round figures, as metrics.final is a mean over the
    # pinned history: pinning them again would add nothing and would read as a numerics change.
    history = [{k: v for k, v in entry.items() if k not in ("seconds", "phases", *GROUPS)} for entry in record["history"]]
    metrics = None
    if record["metrics"]:
        metrics = {k: ({f: x for f, x in v.items() if f != "final"} if k in GROUPS else v)
                   for k, v in record["metrics"].items() if k != "final"}
    return {
        "method_version": record["method"]["version"],
        "status": record["status"],
        "selection": record["selection"],
        "metrics": metrics,
        "history": history,
        "bytes_total": record["cost"]["bytes_total"],
        "partition_hash": record["partition"]["hash"],
    }


def run_case(method: str, extra: dict, out: Path) -> dict:
    values = dict(method=method, task="digits", clients=4, rounds=3, seed=0, checkpoint_every=0, out=str(out),
                  method_params=dict(PARAMS.get(method, {})), pool=POOL.get(method),
                  public_size=100 if method in PUBLIC else 0, **PROTOCOL)
    values.update(extra)
    cfg = engine.load_task(RunConfig(**values))[1]
    return pinned_view(records.build_record(cfg, engine.run(cfg)))


@pytest.fixture(scope="module")
def pins():
    return json.loads(PIN_FILE.read_text()) if PIN_FILE.exists() else {}


def pin_problem(method: str, pinned: dict | None, got: dict) -> str | None:
    """Why ``got`` may not stand against ``pinned`` (None: it may). Results that differ from the pin
    under the same method version are a numerics change nobody versioned."""
    if pinned is None or pinned == got:
        return None
    version = got["method_version"]
    if pinned.get("method_version") == version:
        return (f"{method}'s results changed but its version is still {version!r}: bump `version` on the "
                f"method's class, then regenerate the pins (HFL_BENCH_UPDATE_PINS=1) in the same commit")
    return (f"{method} is now version {version!r} (pinned under {pinned.get('method_version')!r}): "
            f"regenerate the pins (HFL_BENCH_UPDATE_PINS=1) in the same commit")


def test_pin_problem_forces_a_version_bump():
    pinned = {"method_version": "1.0", "metrics": {"global_acc": 50.0}}
    assert pin_problem("m", None, pinned) is None
    assert pin_problem("m", pinned, dict(pinned)) is None
    changed = {"method_version": "1.0", "metrics": {"global_acc": 51.0}}
    assert "bump `version`" in pin_problem("m", pinned, changed)
    bumped = {"method_version": "1.1", "metrics": {"global_acc": 51.0}}
    assert "regenerate" in pin_problem("m", pinned, bumped) and "bump" not in pin_problem("m", pinned, bumped)


@pytest.mark.parametrize("case,method,extra", CASES, ids=[c[0] for c in CASES])
def test_method_matches_its_pin(case, method, extra, pins, tmp_path):
    got = json.loads(json.dumps(run_case(method, extra, tmp_path)))  # as stored: tuples become lists
    if UPDATE:
        stored = json.loads(PIN_FILE.read_text()) if PIN_FILE.exists() else {}
        problem = pin_problem(method, stored.get(case), got)
        if problem and "bump" in problem:
            pytest.fail(problem)  # regenerating never hides a numerics change under an old version
        stored[case] = got
        PIN_FILE.write_text(json.dumps(dict(sorted(stored.items())), indent=1) + "\n")
        return
    assert case in pins, f"no pin for {case}: run with HFL_BENCH_UPDATE_PINS=1 and commit tests/pins/methods.json"
    problem = pin_problem(method, pins[case], got)
    assert problem is None, problem
