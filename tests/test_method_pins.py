"""Every built-in method's results at a fixed seed and a small budget, pinned.

A refactor must leave these bit for bit on the machine that made them; a change to a method's
numerics changes them, and then the method's ``version`` is bumped and the pin file regenerated in
the same commit (``HFL_BENCH_UPDATE_PINS=1 pytest tests/test_method_pins.py``), with the reason in
the commit message.

Another CPU may round differently. On a host with AMX and AVX512-FP16 (2026-12-01) fedcc's and
fedgd's pins failed: losses moved in the 4th significant digit and a sample or two flipped, whatever
ATen's, MKL's or oneDNN's instruction set was capped to, while every other case stayed bit for bit,
as on every host before. On an AMD EPYC host (2026-12-02) fedkd's failed: one accuracy figure of its
record moved 0.07 points (a sample flipped), every loss identical. For the cases in
``PLATFORM_SENSITIVE`` only, a result that is not identical still stands within another CPU's
rounding noise (``beyond_noise``), with a warning; beyond it, it is a numerics change. Every other
case stays exact: a tolerance would also let small real changes by
(crad's temperature 2 -> 3 moves its pinned figures by less than the tolerance allows).

Each pin holds the method version it was made under: a changed result under the pinned
version fails, and regenerating refuses it too, until the version is bumped. The file lists built-in
methods by name, so an installed plugin method is neither required nor pinned.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from hfl_bench import engine
from hfl_bench import recording as records
from hfl_bench.config import RunConfig
from hfl_bench.testing import builtin_methods, smoke_config

from helpers import seen_unseen_problems

pytestmark = pytest.mark.slow  # every method through real training

PIN_FILE = Path(__file__).parent / "pins" / "methods.json"
UPDATE = os.environ.get("HFL_BENCH_UPDATE_PINS") == "1"

# The optimizer and held-out fraction of the pins, fixed here so that a change of the task's
# protocol defaults (a calibration) does not read as a change of every method's numerics.
PROTOCOL = {"local_epochs": 1, "batch_size": 64, "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4,
            "heldout_fraction": 0.2}
MULTIMODAL = {"task": "digits-mnist1d", "pool": "cpu-mm"}
# (case name, method, extra config): every method hfl-bench registers on the default path, with its
# card's smoke settings, plus the per-batch reference path of the two families that have one, a
# partial-participation round, the missing-modality setting and the CRAD aggregation rules whose
# records are compared with crad's (the version-bumped crad-accuracy, the filter ablations): a rule's
# version is part of its runs' method version (aggregation.run_version).
CASES = [(m, m, {}) for m in builtin_methods()] + [
    ("crad@reference", "crad", {"exec": "reference"}),
    *[(f"crad@{rule}", "crad", {"method_params": {"aggregator": rule}})
      for rule in ("crad-accuracy", "crad-stage1", "crad-no-agreement-filter", "crad-support-filter-only")],
    ("fedmkd@reference", "fedmkd", {"exec": "reference"}),
    ("uniform-kd@partial", "uniform-kd", {"clients_per_round": 3}),
    # the missing-modality setting: recipients' NaN rows, teachers on them, the multimodal Q
    *[(f"{m}@digits-mnist1d", m, MULTIMODAL) for m in ("crad", "fedsocket", "naive-shared")],
]


GROUPS = ("honest", "faulty", "recipients", "donors")
SEEN_UNSEEN_ROUND = ("seen_acc", "unseen_acc")  # a history entry's seen / unseen-class means


def pinned_view(record: dict) -> dict:
    """What a run computes, without timing, dates or provenance."""
    # A client group's per-round and final figures (schema 1.5) are views of the same models as the
    # pinned all-client history and selected-round figures, as metrics.final is a mean over the
    # pinned history: pinning them again would add nothing and would read as a numerics change.
    # The seen / unseen-class accuracy (schema 1.6) is the pinned per-class global figures of the same
    # models restricted to each client's classes: likewise left out, so adding it moved no pin.
    # Each client's figures in the final window (schema 1.6) are the pinned selected-round kind of
    # figure of the same models, per client: left out likewise. So are schema 1.7's per-round
    # endpoint figures (the pinned selected round's ``extra_endpoints`` kind of figure of the same
    # predictors, at every test round) and its headline and selected blocks (a copy of the final
    # figure and of the pinned selected-round figures).
    history = [{k: v for k, v in entry.items()
                if k not in ("seconds", "phases", "client_global_acc", "client_local_acc", *GROUPS,
                             *SEEN_UNSEEN_ROUND, "endpoints")}
               for entry in record["history"]]
    metrics = None
    if record["metrics"]:
        metrics = {k: ({f: x for f, x in v.items() if f not in ("final", "seen_unseen")} if k in GROUPS else v)
                   for k, v in record["metrics"].items() if k not in ("final", "seen_unseen", "headline", "selected")}
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
    # no pretraining split unless the card's smoke settings hold one: a task's default split
    # (digits-mnist1d's) is a protocol default, fixed here like the others
    values = {"method": method, "task": "digits", "clients": 4, "rounds": 3, "seed": 0, "checkpoint_every": 0,
              "out": str(out), "pretrain_size": 0, **smoke_config(method), **PROTOCOL}
    values.update(extra)
    cfg = engine.load_task(RunConfig(**values))[1]
    record = records.build_record(cfg, engine.run(cfg))
    # Every built-in method's record carries the seen / unseen-class accuracy (tests/test_seen_unseen.py);
    # checked here, where every method already runs, rather than in a second run of each.
    assert seen_unseen_problems(record) == [], method
    return pinned_view(record)


@pytest.fixture(scope="module")
def pins():
    return json.loads(PIN_FILE.read_text()) if PIN_FILE.exists() else {}


# The cases whose pins another host's CPU has failed by rounding alone (module docstring); add one
# only with that evidence, in the commit that says where it was seen.
PLATFORM_SENSITIVE = {"fedcc", "fedgd", "fedkd"}
# Another CPU's rounding noise: losses and other continuous figures within 0.2% or 1e-3 absolute;
# accuracies (percent) within 1.5 points, about twice the largest drift seen between hosts (0.7
# points, losses within 0.07%: docs/studies/cross-host.md), one sample of a class's ~70 pinned
# ones. Integers and strings (selected round, bytes, status, hashes) stay exact.
PLATFORM_TOLERANCE = {"rel": 2e-3, "abs": 1e-3, "acc_points": 1.5}


def beyond_noise(pinned, got, path: str = "") -> str | None:
    """The first place where ``got`` differs from ``pinned`` by more than another CPU's rounding
    could (None: nowhere), e.g. ``history[2].train_loss: 0.9558 -> 0.9751``."""
    if isinstance(pinned, dict) and isinstance(got, dict):
        for key in sorted(set(pinned) | set(got), key=str):
            if key not in pinned or key not in got:
                return f"{path}.{key}: only in {'the pin' if key in pinned else 'this run'}".lstrip(".")
            found = beyond_noise(pinned[key], got[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(pinned, list) and isinstance(got, list):
        if len(pinned) != len(got):
            return f"{path}: {len(pinned)} -> {len(got)} entries".lstrip(".")
        for i, (p, g) in enumerate(zip(pinned, got)):
            found = beyond_noise(p, g, f"{path}[{i}]")
            if found:
                return found
        return None
    floats = all(isinstance(x, float) or (isinstance(x, int) and not isinstance(x, bool)) for x in (pinned, got))
    if floats and (isinstance(pinned, float) or isinstance(got, float)):
        if any("acc" in part for part in path.split(".")):  # e.g. per_arch_global_acc.resnet_tiny
            allowed = PLATFORM_TOLERANCE["acc_points"]
        else:
            allowed = max(PLATFORM_TOLERANCE["abs"], PLATFORM_TOLERANCE["rel"] * abs(pinned))
        return None if abs(got - pinned) <= allowed else f"{path}: {pinned} -> {got}".lstrip(".")
    return None if pinned == got else f"{path}: {pinned!r} -> {got!r}".lstrip(".")


def pin_problem(method: str, pinned: dict | None, got: dict, tolerant: bool = False) -> str | None:
    """Why ``got`` may not stand against ``pinned`` (None: it may). Results that differ from the pin
    under the same method version (with ``tolerant``, by more than another CPU's rounding noise) are
    a numerics change nobody versioned."""
    if pinned is None or pinned == got:
        return None
    version = got["method_version"]
    where = beyond_noise(pinned, got) if tolerant else "not bit for bit"
    if pinned.get("method_version") == version and where is None:
        return None
    if pinned.get("method_version") == version:
        return (f"{method}'s results changed ({where}) but its version is still {version!r}: bump `version` "
                f"on the method's class (or, for a change of its aggregation rule alone, the rule's: "
                f"register_aggregator(name, version=...)), then regenerate the pins (HFL_BENCH_UPDATE_PINS=1) "
                f"in the same commit")
    return (f"{method} is now version {version!r} (pinned under {pinned.get('method_version')!r}): "
            f"regenerate the pins (HFL_BENCH_UPDATE_PINS=1) in the same commit")


def test_pin_problem_forces_a_version_bump():
    pinned = {"method_version": "1.0", "selection": {"round": 3},
              "metrics": {"global_acc": 50.0}, "history": [{"train_loss": 0.9558}]}
    assert pin_problem("m", None, pinned) is None
    assert pin_problem("m", pinned, json.loads(json.dumps(pinned))) is None
    changed = {**pinned, "metrics": {"global_acc": 61.0}}
    assert "bump `version`" in pin_problem("m", pinned, changed)
    bumped = {**changed, "method_version": "1.1"}
    assert "regenerate" in pin_problem("m", pinned, bumped) and "bump" not in pin_problem("m", pinned, bumped)


def test_another_cpus_rounding_stands_and_a_numerics_change_does_not():
    """The two hosts' fedcc figures (module docstring) stand; a loss 2% off, another selected round
    or an accuracy 2 points off (beyond twice the hosts' 0.7) does not, under the same version."""
    pinned = {"method_version": "1.0", "selection": {"round": 3}, "bytes_total": 1000,
              "metrics": {"per_class_global_acc": [77.7778, 25.0], "per_arch_global_acc": {"cnn_small": 35.9331}},
              "history": [{"train_loss": 0.9558, "alpha_mean": 0.1058, "local_acc": 75.6226}]}
    noisy = {**pinned,
             "metrics": {"per_class_global_acc": [78.4722, 24.2857], "per_arch_global_acc": {"cnn_small": 35.6546}},
             "history": [{"train_loss": 0.9552, "alpha_mean": 0.106, "local_acc": 76.2983}]}
    assert pin_problem("fedcc", pinned, noisy, tolerant=True) is None
    assert "not bit for bit" in pin_problem("crad", pinned, noisy)  # an exact case stays exact
    for changed, where in [
        ({**pinned, "history": [{**pinned["history"][0], "train_loss": 0.9751}]}, "history[0].train_loss"),
        ({**pinned, "selection": {"round": 2}}, "selection.round"),
        ({**pinned, "bytes_total": 1001}, "bytes_total"),
        ({**pinned, "history": [{**pinned["history"][0], "local_acc": 77.6226}]}, "history[0].local_acc"),
        ({**pinned, "history": [{**pinned["history"][0], "extra_loss": 0.1}]}, "extra_loss: only in this run"),
    ]:
        problem = pin_problem("fedcc", pinned, changed, tolerant=True)
        assert problem and "bump `version`" in problem and where in problem, (where, problem)


NO_PIN = "no pin for {}: run with HFL_BENCH_UPDATE_PINS=1 and commit tests/pins/methods.json"


@pytest.mark.skipif(UPDATE, reason="regenerating the pins")
def test_every_case_has_a_pin_and_every_pin_a_case(pins):
    cases = {c[0] for c in CASES}
    assert not sorted(set(pins) - cases), f"pins of no case (a method gone or renamed): {sorted(set(pins) - cases)}"
    assert not sorted(cases - set(pins)), NO_PIN.format(", ".join(sorted(cases - set(pins))))


@pytest.mark.parametrize("case,method,extra", CASES, ids=[c[0] for c in CASES])
def test_method_matches_its_pin(case, method, extra, pins, tmp_path):
    assert UPDATE or case in pins, NO_PIN.format(case)  # before the run: fails in a second
    got = json.loads(json.dumps(run_case(method, extra, tmp_path)))  # as stored: tuples become lists
    if UPDATE:
        stored = json.loads(PIN_FILE.read_text()) if PIN_FILE.exists() else {}
        problem = pin_problem(method, stored.get(case), got, tolerant=case in PLATFORM_SENSITIVE)
        if problem and "bump" in problem:
            pytest.fail(problem)  # regenerating never hides a numerics change under an old version
        if problem or case not in stored:  # within another CPU's noise, the pin stays as it is
            stored[case] = got
            PIN_FILE.write_text(json.dumps(dict(sorted(stored.items())), indent=1) + "\n")
        return
    problem = pin_problem(method, pins[case], got, tolerant=case in PLATFORM_SENSITIVE)
    assert problem is None, problem
    if got != pins[case]:
        warnings.warn(f"{case}: not bit for bit the pin, but within another CPU's rounding noise "
                      f"(PLATFORM_SENSITIVE, PLATFORM_TOLERANCE)")
