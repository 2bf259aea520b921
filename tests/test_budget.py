"""The work meter (hfl_bench.metering.Budget) and each method's budget.

Every registered method runs once at its defaults (the card's smoke settings only where they cut
public or synthetic work, never private epochs; its smoke pool and public set) on 4 digits clients
for 2 rounds. From that one run:

- ``test_counted_steps_equal_the_plan``: the steps and samples counted per client on private,
  public and synthetic data, and by the server, are exactly what the method's own plan says
  (``plain``, the protocol's budget, unless ``BY_DESIGN`` below writes out another plan from what
  the method does, read from its settings). A new method is held to the protocol's budget until
  its own plan is written here.
- ``test_private_budget_equals_locals``: under defaults, a method trains its clients' private data
  for the same steps per client per round as ``local`` (the protocol's local epochs, batch size),
  (the protocol's local epochs, batch size), except where a method differs by design (dfml).
"""

from __future__ import annotations

import csv
import functools
import io
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hfl_bench import engine
from hfl_bench import recording as records
from hfl_bench.cli import app
from hfl_bench.config import RunConfig, config_hash
from hfl_bench.metering import SERVER, Budget, Data
from hfl_bench.methods.dfml import draw_aggregator
from hfl_bench.methods.fedcc import private_epochs
from hfl_bench.methods.fedl2g import warm_up_rounds
from hfl_bench.record.check import problems as record_problems
from hfl_bench.results.budget import steps_label
from hfl_bench.testing import builtin_methods, smoke_config
from hfl_bench.training import batch_bounds

ROUNDS, CLIENTS = 2, 4
# Smoke settings that cut only public or synthetic work (or the server's): kept, so the runs stay
# quick. Every other smoke setting (fedsocket's warm-up and stage epochs, fedmd's private
# initialization) would change the private budget under test, and is dropped.
NON_PRIVATE_SMOKE = {"transfer_epochs", "g_steps", "synthetic_size", "pretrain_steps",
                     "distill_steps", "eval_every", "patience"}  # feddf's server distillation


def defaults_config(method: str, out: Path, **overrides) -> RunConfig:
    smoke = smoke_config(method)
    params = {k: v for k, v in smoke["method_params"].items() if k in NON_PRIVATE_SMOKE}
    values = dict(method=method, task="digits", clients=CLIENTS, rounds=ROUNDS, seed=0, checkpoint_every=0,
                  out=str(out), pool=smoke["pool"], public_size=smoke["public_size"],
                  pretrain_size=smoke.get("pretrain_size", 0), method_params=params)
    values.update(overrides)
    return engine.load_task(RunConfig(**values))[1]


@functools.cache
def run_at_defaults(method: str, out: str, **overrides) -> tuple[dict, engine.Simulation]:
    """One run of ``method`` at its defaults: its record and its finished simulation."""
    sim = engine.Simulation(defaults_config(method, Path(out) / method, **overrides))
    result = sim.run()
    return records.build_record(sim.cfg, result), sim


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("budget"))


# ----------------------------------------------------------------------------- each method's plan


class Plan:
    """The expected totals of a run: steps per client on each kind of data, and the server's."""

    def __init__(self, sim: engine.Simulation):
        self.sim, self.cfg, self.fed, self.p = sim, sim.cfg, sim.fed, sim.method.params
        self.steps = {kind: np.zeros(CLIENTS, dtype=int) for kind in ("private", "public", "synthetic")}
        self.samples = {kind: np.zeros(CLIENTS, dtype=int) for kind in ("private", "public", "synthetic")}
        self.server = [0, 0]
        self.shards = np.array([c.n_train for c in self.fed.clients])
        self.public = len(self.fed.public_idx)

    def batches(self, n: int) -> int:
        return len(batch_bounds(n, self.cfg.batch_size))

    def private(self, epochs: int, rounds: int = ROUNDS) -> "Plan":
        """``epochs`` epochs over each client's own shard in each of ``rounds`` rounds."""
        self.steps["private"] += rounds * epochs * np.array([self.batches(n) for n in self.shards])
        self.samples["private"] += rounds * epochs * self.shards
        return self

    def transfer(self, kind: str, epochs: int, size: int, rounds: int = ROUNDS) -> "Plan":
        """``epochs`` epochs over ``size`` shared transfer inputs, by every client, in ``rounds`` rounds."""
        self.steps[kind] += rounds * epochs * self.batches(size)
        self.samples[kind] += rounds * epochs * size
        return self


def plain(plan: Plan) -> Plan:
    """The protocol: the run's local epochs over each client's shard each round."""
    return plan.private(plan.cfg.local_epochs)


def dfml(plan: Plan) -> Plan:
    """Each round every participant's model trains K epochs over the aggregator's shard (at the
    aggregator): each client is charged K x the aggregator's batches."""
    k = plan.p.epochs or plan.cfg.local_epochs
    for rnd in range(1, ROUNDS + 1):
        a = draw_aggregator(plan.cfg.seed, rnd, list(range(CLIENTS)))
        plan.steps["private"] += k * plan.batches(int(plan.shards[a]))
        plan.samples["private"] += k * int(plan.shards[a])
    return plan


def fedcc(plan: Plan) -> Plan:
    """Per round: the CE step's and the pseudo-label step's epochs over the shard (together the
    config's local epochs, ``fedcc.private_epochs``; the ``paper`` preset adds the pseudo-label
    epochs on top); sync_epochs over the public set from round 2 (round 1 has no broadcast
    targets). The pseudo-label step's public rows ride in the private steps (one forward): not
    counted apart."""
    p = plan.p
    plan.private(sum(private_epochs(plan.cfg.local_epochs, p)))
    return plan.transfer("public", p.sync_epochs, plan.public, rounds=ROUNDS - 1)


def fedmd(plan: Plan) -> Plan:
    """Setup: transfer_epochs over the labelled public set, private_init_epochs over the shard.
    Per round: digest_epochs over the alignment set, then the revisit epochs over the shard."""
    p = plan.p
    plan.transfer("public", p.transfer_epochs, plan.public, rounds=1).private(p.private_init_epochs, rounds=1)
    aligned = plan.public if p.alignment_size == 0 else min(p.alignment_size, plan.public)
    revisit = plan.cfg.local_epochs if p.revisit_epochs is None else p.revisit_epochs
    return plan.transfer("public", p.digest_epochs, aligned).private(revisit)


def fedgd(plan: Plan) -> Plan:
    """Per round: the coordinator's g_steps generator steps (server), every client digests the
    synthetic set for digest_epochs and revisits its shard."""
    p = plan.p
    plan.server = [ROUNDS * p.g_steps, ROUNDS * p.g_steps * p.g_batch_size]
    revisit = plan.cfg.local_epochs if p.revisit_epochs is None else p.revisit_epochs
    return plan.transfer("synthetic", p.digest_epochs, p.synthetic_size).private(revisit)


def msfkd(plan: Plan) -> Plan:
    """Per round: distill_epochs over the public set, then E_l epochs over the shard."""
    p = plan.p
    return plan.transfer("public", p.distill_epochs, plan.public).private(p.local_epochs or plan.cfg.local_epochs)


def ds_fl(plan: Plan) -> Plan:
    """Per round: the config's local epochs over the shard, then distill_epochs over the public set."""
    return plan.private(plan.cfg.local_epochs).transfer("public", plan.p.distill_epochs, plan.public)


def shared_predictor(plan: Plan) -> Plan:
    """Setup: warmup_epochs of Private over the shard. Per round: the stage epochs of Private, then
    as many of the Q copy (a second pass over the shard's features)."""
    p = plan.p
    stage = p.local_epochs or plan.cfg.local_epochs
    return plan.private(p.warmup_epochs, rounds=1).private(2 * stage)


def fedl2g(plan: Plan) -> Plan:
    """Per round after the warm-up: the run's local epochs over the shard less its quiz set. Every
    round: the meta step's study batches (of the shard less the quiz set), and one server step on
    the guides (no samples)."""
    p, cfg = plan.p, plan.cfg
    rest = [int(n) - min(p.meta_quiz_batches * cfg.batch_size, int(n) // 2) for n in plan.shards]
    trained = ROUNDS - warm_up_rounds(p.warm_up, ROUNDS)
    study = [batch_bounds(n, cfg.batch_size)[: p.meta_study_batches] for n in rest]
    plan.steps["private"] += np.array([trained * cfg.local_epochs * plan.batches(n) + ROUNDS * len(b)
                                       for n, b in zip(rest, study)])
    plan.samples["private"] += np.array([trained * cfg.local_epochs * n + ROUNDS * sum(e - s for s, e in b)
                                         for n, b in zip(rest, study)])
    plan.server = [ROUNDS, 0]
    return plan


def fedtgp(plan: Plan) -> Plan:
    """The protocol, plus the server's TGP training each round: server_epochs epochs over the
    uploaded (prototype, class) pairs, one per class each client holds, at the run's batch size."""
    pairs = sum(int((c.train_counts > 0).sum()) for c in plan.fed.clients)
    epochs = plan.p.server_epochs
    plan.server = [ROUNDS * epochs * plan.batches(pairs), ROUNDS * epochs * pairs]
    return plain(plan)


def fedgh(plan: Plan) -> Plan:
    """The protocol's local epochs, then per round the server's server_epochs epochs over the
    uploaded class means (one per class a client holds) in batches of the run's batch size."""
    p, b = plan.p, plan.cfg.batch_size
    pairs = sum(int((c.train_counts > 0).sum()) for c in plan.fed.clients)
    plan.server = [ROUNDS * p.server_epochs * -(-pairs // b), ROUNDS * p.server_epochs * pairs]
    return plain(plan)


def fedgen(plan: Plan) -> Plan:
    """The protocol's local epochs, each private step with one batch of generated features (counted
    as synthetic samples, no steps of their own); per round the server's g_steps generator steps."""
    p, b = plan.p, plan.cfg.batch_size
    plan.samples["synthetic"] += ROUNDS * plan.cfg.local_epochs * b * np.array([plan.batches(n) for n in plan.shards])
    plan.server = [ROUNDS * p.g_steps, ROUNDS * p.g_steps * b]
    return plain(plan)


def feddf(plan: Plan) -> Plan:
    """The protocol's local epochs, then per round and architecture prototype (every client active)
    the server's distill_steps steps over the public set less its held-out part, in endless epochs
    of distill_batch_size. The smoke settings' patience is the steps': no early stop."""
    p = plan.p
    assert p.patience >= p.distill_steps  # else the steps would depend on what the early stop sees
    held_out = min(plan.public - 1, max(1, round(plan.public * p.val_fraction)))
    sizes = [e - s for s, e in batch_bounds(plan.public - held_out, p.distill_batch_size)]
    samples = sum(sizes[i % len(sizes)] for i in range(p.distill_steps))
    prototypes = len({(c.arch.model, repr(sorted(c.arch.kwargs.items()))) for c in plan.fed.clients})
    plan.server = [ROUNDS * prototypes * p.distill_steps, ROUNDS * prototypes * samples]
    return plain(plan)


# The methods whose budget is not the protocol's (``plain``), each by design; every other
# registered method is held to ``plain``. FML steps its private model and its meme on the same
# batch: one step per batch (a step is one batch a client trains on), so it is plain.
BY_DESIGN = {
    "dfml": dfml, "fedcc": fedcc, "feddf": feddf, "fedmd": fedmd, "fedgd": fedgd, "msfkd": msfkd, "ds-fl": ds_fl,
    "fedsocket": shared_predictor, "naive-shared": shared_predictor, "fedl2g": fedl2g,
    "fedtgp": fedtgp, "fedgh": fedgh, "fedgen": fedgen,
}


@pytest.mark.slow  # every method through real training
@pytest.mark.parametrize("method", builtin_methods())
def test_counted_steps_equal_the_plan(method, out):
    record, sim = run_at_defaults(method, out)
    assert record["status"] == "ok", record["error"]
    plan = BY_DESIGN.get(method, plain)(Plan(sim))
    budget = record["cost"]["budget"]
    for kind in ("private", "public", "synthetic"):
        assert budget["per_client"][kind]["steps"] == plan.steps[kind].tolist(), kind
        assert budget["per_client"][kind]["samples"] == plan.samples[kind].tolist(), kind
        assert budget["per_client_round"][kind]["steps"] == pytest.approx(plan.steps[kind].mean() / ROUNDS, abs=1e-4)
        expected = {"steps": int(plan.steps[kind].sum()), "samples": int(plan.samples[kind].sum())}
        assert budget["totals"][kind] == expected
    assert [budget["totals"]["server"]["steps"], budget["totals"]["server"]["samples"]] == plan.server
    assert budget["rounds"] == ROUNDS
    assert record_problems(json.loads(json.dumps(record))) == []


@pytest.mark.slow  # every method through real training
@pytest.mark.parametrize("method", builtin_methods())
def test_private_budget_equals_locals(method, out):
    """Under defaults, private steps per client per round equal local's, except by design:
    dfml trains every participant on the round's aggregator's shard for the protocol's local
    epochs (the same epochs as local, over another shard: compared with local's steps on that
    shard); fedsocket and naive-shared train two models per client, Private and the client's copy
    of the shared predictor Q, each for the protocol's local epochs in its own pass over the shard
    (twice local's steps; FML steps its two models on the same batch: once); fedl2g trains on its
    shard less a quiz set and adds a meta step each round (its plan, ``fedl2g`` above)."""
    record, sim = run_at_defaults(method, out)
    # local on the same partition: a public set (or a pretraining split) is held out of the clients' shards
    local, _ = run_at_defaults("local", out, public_size=sim.cfg.public_size, pretrain_size=sim.cfg.pretrain_size)
    steps = record["cost"]["budget"]["per_client"]["private"]["steps"]
    reference = local["cost"]["budget"]["per_client"]["private"]["steps"]
    if method == "dfml":
        aggregators = [draw_aggregator(sim.cfg.seed, rnd, list(range(CLIENTS))) for rnd in range(1, ROUNDS + 1)]
        reference = [sum(reference[a] // ROUNDS for a in aggregators)] * CLIENTS  # local's round on each
    if method in ("fedsocket", "naive-shared"):
        reference = [2 * r for r in reference]
    if method == "fedl2g":
        reference = fedl2g(Plan(sim)).steps["private"].tolist()
    assert steps == reference


# ----------------------------------------------------------------------------- the meter


def test_the_meter_counts_by_kind_keeps_the_setup_apart_and_round_trips():
    meter = Budget(3)
    meter.add(0, Data.PRIVATE, 10, 160)  # setup: a warm-up
    meter.start_round(1)
    meter.add(0, Data.PRIVATE, 5, 80)
    meter.add(1, Data.PUBLIC, 2, 32)
    meter.add(SERVER, Data.SERVER, 3, 192)
    meter.start_round(2)
    meter.add(2, Data.SYNTHETIC, 4, 64)
    rec = meter.record()
    assert rec["rounds"] == 2
    assert rec["totals"] == {"private": {"steps": 15, "samples": 240}, "public": {"steps": 2, "samples": 32},
                             "synthetic": {"steps": 4, "samples": 64}, "server": {"steps": 3, "samples": 192}}
    assert rec["setup"]["private"] == {"steps": 10, "samples": 160} and rec["setup"]["server"]["steps"] == 0
    assert rec["per_client_round"]["private"] == {"steps": 2.5, "samples": 40.0}  # 15 steps / 3 clients / 2 rounds
    assert rec["server_per_round"] == {"steps": 1.5, "samples": 96.0}
    assert rec["per_client"]["private"]["steps"] == [15, 0, 0]
    copy = Budget(3)
    copy.load(meter.state())
    assert copy.record() == rec
    for cid, kind in ((SERVER, Data.PRIVATE), (0, Data.SERVER), (3, Data.PRIVATE)):
        with pytest.raises(ValueError):
            meter.add(cid, kind, 1, 1)


def test_a_free_rider_counts_nothing(out):
    cfg = defaults_config("local", Path(out), faults="free-rider:[1]", local_epochs=1)
    record = records.build_record(cfg, engine.run(cfg))
    steps = record["cost"]["budget"]["per_client"]["private"]["steps"]
    assert steps[1] == 0 and all(s > 0 for i, s in enumerate(steps) if i != 1)


# ----------------------------------------------------------------------------- the views


def _record_with(steps: dict[str, float] | None, server: float = 0.0) -> dict:
    budget = None if steps is None else {
        "per_client_round": {k: {"steps": steps.get(k, 0.0), "samples": 0.0}
                             for k in ("private", "public", "synthetic")},
        "server_per_round": {"steps": server, "samples": 0.0}}
    return {"cost": {} if budget is None else {"budget": budget}}


def test_the_steps_label():
    assert steps_label([_record_with(None)]) == "-"
    assert steps_label([_record_with({"private": 100})]) == "100"
    assert steps_label([_record_with({"private": 100}), _record_with({"private": 81.25})]) == "90.6"
    assert steps_label([_record_with({"private": 100, "public": 20})]) == "100 (all 120)"
    assert steps_label([_record_with({"private": 100, "synthetic": 8}, server=2)]) == "100 (all 108, server 2)"
    assert steps_label([_record_with(None), _record_with({"private": 50})]) == "50"  # the seeds that have one


def _show(folder: Path, fmt: str) -> str:
    result = CliRunner().invoke(app, ["leaderboard", "show", str(folder), "--format", fmt])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_show_and_the_site_carry_the_column_and_a_dash_for_older_records(out, tmp_path):
    folder = tmp_path / "records"
    folder.mkdir()
    fedgd_record, _ = run_at_defaults("fedgd", out)
    local_record, _ = run_at_defaults("local", out)
    older = json.loads(json.dumps(local_record))
    older["schema_version"] = "1.2"  # written before budgets
    del older["cost"]["budget"]
    older["config"]["lr"] = 0.5  # another setting: its own group
    older["config_hash"] = config_hash(older["config"])
    for name, r in (("fedgd.json", fedgd_record), ("local.json", local_record), ("older.json", older)):
        (folder / name).write_text(json.dumps(r))
    expect = {"fedgd": steps_label([fedgd_record]), "local": steps_label([local_record])}
    assert "(all " in expect["fedgd"] and "server" in expect["fedgd"] and "(" not in expect["local"] != "-"

    groups = json.loads(_show(folder, "json"))["groups"]
    steps = {(g["method"], g["steps_per_client_round"]["n"]): g["steps_per_client_round"] for g in groups}
    assert set(steps) == {("fedgd", 1), ("local", 1), ("local", 0)}  # the older record's group has no budget
    assert steps[("local", 0)]["private"] is None and steps[("local", 0)]["all"] is None
    assert steps[("fedgd", 1)]["server"] == fedgd_record["cost"]["budget"]["server_per_round"]["steps"]

    rows = list(csv.DictReader(io.StringIO(_show(folder, "csv"))))
    local_private = sorted((r["private_steps_per_client_round"] for r in rows if r["method"] == "local"), key=len)
    local_steps = local_record["cost"]["budget"]["per_client_round"]["private"]["steps"]
    assert local_private[0] == "" and float(local_private[1]) == local_steps

    markdown = _show(folder, "markdown")
    header = next(line for line in markdown.splitlines() if line.startswith("| method"))
    assert "| steps / client / round |" in header
    lines = [line for line in markdown.splitlines() if line.startswith("| local ") or line.startswith("| fedgd ")]
    assert any(f"| {expect['local']} |" in line for line in lines) and any("| - |" in line for line in lines)
    assert any(f"| {expect['fedgd']} |" in line for line in lines)
    table = _show(folder, "table")
    assert "steps /" in table and "client /" in table  # the header, stacked

    site = tmp_path / "site"
    result = CliRunner().invoke(app, ["leaderboard", "html", str(site), str(folder)])
    assert result.exit_code == 0, result.output
    page = (site / "index.html").read_text()
    assert "steps / client / round</th>" in page and f">{expect['fedgd']}</td>" in page
    assert f">{expect['local']}</td>" in page and ">-</td>" in page
