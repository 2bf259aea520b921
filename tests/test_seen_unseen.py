"""Seen / unseen-class accuracy (record schema 1.6): each client's global test accuracy on the test
samples of the classes it holds in training and of those it lacks, averaged over clients.

The arithmetic by hand on synthetic per-class counts; a real run's record (a run with faults, so
the honest and faulty groups too) at the selected round and over the final window, checked against
its own per-client figures and against each client's global accuracy; the views (``show``,
``leaderboard show`` json and csv, the HTML group page, the ``seen-unseen`` plot) with that record
beside one from before 1.6, which shows "-". Every built-in method's record is checked where every
method already runs: tests/test_method_pins.py (``helpers.seen_unseen_problems``)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hfl_bench import engine
from hfl_bench import recording as records
from hfl_bench.cli import app
from hfl_bench.config import FINAL_ROUNDS, HELD_MIN_TRAIN_COUNT, RunConfig
from hfl_bench.evaluation import held_classes, seen_unseen_acc
from hfl_bench.record.check import problems as record_problems
from hfl_bench.results.html import build_site
from hfl_bench.results.plots import make_plots
from hfl_bench.testing import QUICK

from helpers import seen_unseen_problems

REPO = Path(__file__).resolve().parent.parent
OLD = REPO / "leaderboards" / "archive" / "first-wave" / "digits" / "digits__crad__da48ac8fb4f0dad1__seed0.json"
FAULTS = "byzantine:[0]/random"


def test_seen_and_unseen_accuracy_by_hand():
    train = np.array([[5, 1, 0], [0, 0, 7], [2, 3, 4]])  # client 0 lacks class 2, client 1 classes 0 and 1
    held = held_classes(train)
    assert held.tolist() == [[True, True, False], [False, False, True], [True, True, True]]
    assert held_classes(train, min_count=2).tolist() == [[True, False, False], [False, False, True], [True, True, True]]
    test_counts = np.array([10, 20, 30])
    correct = np.array([[8, 10, 3], [1, 2, 27], [5, 5, 5]])
    seen, unseen = seen_unseen_acc(correct, test_counts, held)
    # client 0: seen (8 + 10) / (10 + 20), unseen 3 / 30; client 1: seen 27 / 30, unseen (1 + 2) / (10 + 20);
    # client 2 holds every class: seen 15 / 60, no unseen figure
    assert seen.tolist() == pytest.approx([60.0, 90.0, 25.0])
    assert unseen[:2].tolist() == pytest.approx([10.0, 10.0]) and np.isnan(unseen[2])
    # a class the test set lacks weighs nothing: client 0's unseen class has no test sample -> no figure
    _, unseen = seen_unseen_acc(correct * [1, 1, 0], np.array([10, 20, 0]), held)
    assert np.isnan(unseen[0]) and unseen[1] == pytest.approx(10.0)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[dict, dict]:
    """A real run with faults (honest and faulty groups): its record and, per client, the test
    class counts and the classes it holds, to check the record against."""
    values = dict(method="local", task="digits", clients=4, rounds=3, seed=0, checkpoint_every=0, faults=FAULTS,
                  **QUICK)
    cfg = engine.load_task(RunConfig(**values))[1]
    result = engine.run(cfg)
    record = json.loads(json.dumps(records.build_record(cfg, result)))
    fed = result.fed
    context = {"test_counts": np.bincount(fed.data.test_y.numpy(), minlength=fed.num_classes),
               "held": np.asarray(record["partition"]["train_counts"]) >= HELD_MIN_TRAIN_COUNT}
    return record, context


def test_a_run_records_seen_and_unseen_accuracy(run):
    record, ctx = run
    assert record["schema_version"] == records.SCHEMA_VERSION == "1.11"
    assert record_problems(record) == []  # valid against schema 1.6
    assert seen_unseen_problems(record) == []
    su = record["metrics"]["seen_unseen"]
    assert su["min_train_count"] == 1 and su["n_clients"] == 4
    lacking = ctx["held"].shape[0] - int(ctx["held"].all(1).sum())
    assert lacking > 0 and su["n_clients_unseen"] == lacking  # the test set has every class
    per_client = {c["cid"]: c for c in su["per_client"]}
    # each client's global accuracy is its seen and unseen accuracy weighted by their test samples
    n_test = ctx["test_counts"].sum()
    for c in record["metrics"]["per_client"]:
        mine = per_client[c["cid"]]
        n_seen = ctx["test_counts"][ctx["held"][c["cid"]]].sum()
        unseen = mine["unseen_acc"] or 0.0
        assert c["global_acc"] == pytest.approx((mine["seen_acc"] * n_seen + unseen * (n_test - n_seen)) / n_test,
                                                abs=1e-3)
        assert mine["n_seen_classes"] == int(ctx["held"][c["cid"]].sum())
    # the means: over the clients with a figure; per architecture; per client group
    figures = [c["unseen_acc"] for c in su["per_client"] if c["unseen_acc"] is not None]
    assert su["unseen_acc"] == pytest.approx(np.mean(figures), abs=1e-3)
    assert su["seen_acc"] == pytest.approx(np.mean([c["seen_acc"] for c in su["per_client"]]), abs=1e-3)
    archs = record["arch_pool"]["assignment"]
    for arch, got in su["per_arch"].items():
        mine = [per_client[cid]["seen_acc"] for cid, a in enumerate(archs) if a == arch]
        assert got["seen_acc"] == pytest.approx(np.mean(mine), abs=1e-3)
    for group in ("honest", "faulty"):
        clients = record["faults"][f"{group}_clients"]
        block = record["metrics"][group]["seen_unseen"]
        assert block["n_clients"] == len(clients)
        assert block["seen_acc"] == pytest.approx(np.mean([per_client[c]["seen_acc"] for c in clients]), abs=1e-3)
        selected = record["history"][record["selection"]["round"]][group]
        assert (selected["seen_acc"], selected["unseen_acc"]) == (block["seen_acc"], block["unseen_acc"])
    # the final window: metrics.final's rounds, the per-round means averaged
    final, window = su["final"], record["metrics"]["final"]
    assert (final["first_round"], final["last_round"]) == (window["first_round"], window["last_round"])
    rows = [h for h in record["history"] if final["first_round"] <= h["round"] <= final["last_round"]
            and h.get("global_acc") is not None][-FINAL_ROUNDS:]
    assert final["seen_acc"] == pytest.approx(np.mean([h["seen_acc"] for h in rows]), abs=1e-3)
    assert final["unseen_acc"] == pytest.approx(np.mean([h["unseen_acc"] for h in rows]), abs=1e-3)


# ----------------------------------------------------------------------------- the views


@pytest.fixture(scope="module")
def folder(run, tmp_path_factory) -> Path:
    """The run's record beside a record from before schema 1.6 (no seen / unseen figures)."""
    root = tmp_path_factory.mktemp("records")
    (root / "new.json").write_text(json.dumps(run[0]))
    (root / "old.json").write_text(OLD.read_text())
    return root


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def _row(text: str, field: str) -> str:
    return next(line for line in text.splitlines() if field in line)


def test_show_gives_seen_and_unseen_accuracy(run, folder):
    su = run[0]["metrics"]["seen_unseen"]
    text = _invoke("show", str(folder / "new.json"))
    assert f"{su['seen_acc']:.2f}" in _row(text, "seen-class acc (%)")
    lacking = f"{su['unseen_acc']:.2f} ({su['n_clients_unseen']} of 4 clients lack a class)"
    assert lacking in _row(text, "unseen-class acc (%)")
    honest = run[0]["metrics"]["honest"]["seen_unseen"]
    assert f"{honest['seen_acc']:.2f}" in _row(text, "seen-class acc, honest (%)")
    final = f"{su['final']['seen_acc']:.2f} / {su['final']['unseen_acc']:.2f}"
    assert final in _row(text, "final seen / unseen acc (%)")
    arch, figures = next(iter(su["per_arch"].items()))
    per_arch_table = text.split("global accuracy per architecture")[1]
    assert f"{figures['seen_acc']:.2f} │" in _row(per_arch_table, f"{arch} ")
    old = _invoke("show", str(folder / "old.json"))
    assert _row(old, "seen-class acc (%)").rstrip(" │|").endswith("-")
    assert "unseen acc" in old and "seen-class acc, honest" not in old


def test_leaderboard_json_and_csv_carry_them(run, folder):
    board = json.loads(_invoke("leaderboard", "show", str(folder), "--format", "json"))
    by_method = {g["method"]: g for g in board["groups"]}
    new, old = by_method["local"], by_method["crad"]
    honest = run[0]["metrics"]["honest"]["seen_unseen"]  # the headline of a run with faults
    assert new["seen_unseen"]["seen_acc"] == {"mean": honest["seen_acc"], "sd": None, "n": 1}
    assert new["seen_unseen"]["final_unseen_acc"]["mean"] == honest["final"]["unseen_acc"]
    assert new["seen_unseen_all_clients"]["unseen_acc"]["mean"] == run[0]["metrics"]["seen_unseen"]["unseen_acc"]
    assert old["seen_unseen"]["seen_acc"] == {"mean": None, "sd": None, "n": 0}
    rows = {r["method"]: r for r in csv.DictReader(io.StringIO(_invoke("leaderboard", "show", str(folder),
                                                                       "--format", "csv")))}
    assert float(rows["local"]["seen_mean"]) == honest["seen_acc"]
    assert float(rows["local"]["all_unseen_mean"]) == run[0]["metrics"]["seen_unseen"]["unseen_acc"]
    assert rows["crad"]["seen_mean"] == rows["crad"]["final_unseen_mean"] == ""


def test_the_html_group_page_and_the_plot_show_them(run, folder, tmp_path):
    site = build_site(tmp_path / "site", [folder])
    pages = {p: p.read_text() for p in site.group_pages}
    new = next(t for t in pages.values() if "local on digits" in t)
    old = next(t for t in pages.values() if "crad on digits" in t)
    su = run[0]["metrics"]["seen_unseen"]
    assert "<h2>Seen and unseen classes</h2>" in new and f"{su['unseen_acc']:.2f} ± -" in new
    assert "headline (honest clients)" in new and "faulty clients" in new
    assert "The records carry no seen / unseen-class accuracy (older records do not)." in old
    assert any(Path(p).name.startswith("seen-unseen__digits") for p in site.plots)  # ``plot all`` draws it
    written, skipped = make_plots("seen-unseen", [folder], tmp_path / "plots")
    assert [w.kind for w in written] == ["seen-unseen"] and [r.record_id for r in written[0].drawn] == [
        run[0]["record_id"]]
    assert any(s.reason == "seen-unseen: no metrics.seen_unseen (written from record schema 1.6 on)" for s in skipped)
