"""Federations at scale (issue 67): client state kept off the device (``--client-state``), sampled
evaluation (``--eval-clients``) and tiny clients' held-out samples, through the real CLI."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from hfl_bench.clientstate import ClientStateError, ClientStore, client_modules
from hfl_bench.config import RunConfig, config_hash
from hfl_bench.partition import make_partition, split_client
from tests.helpers import cpu_federation, invoke_cli

# Partial participation on digits, test rounds every 2 (rounds 0 and 2 outside the final window of 10).
BASE = ("-t", "digits", "--clients", "8", "--clients-per-round", "3", "--rounds", "12", "--eval-every", "2",
        "--local-epochs", "1", "--batch-size", "64", "--lr", "0.01", "--checkpoint-every", "0")


def figures(record: dict) -> tuple:
    """Everything a record computed: its history (less timings), metrics and selection."""
    history = [{k: v for k, v in e.items() if k not in ("seconds", "phases")} for e in record["history"]]
    return history, record["metrics"], record["selection"], record["config_hash"]


# fedavg: a server model every client is evaluated with; fedproto: every client's predictor changes
# each round (validated in chunks under host or disk state); fml: a meme kept with each client;
# fedsocket: a Q predictor kept with each client, three endpoints wrapping it and one shared extractor
@pytest.mark.parametrize("method,args", [("local", ()), ("crad", ()), ("fedavg", ("--pool", "cpu-cnn")),
                                         ("fedproto", ()), ("fml", ()),
                                         ("fedsocket", ("--set", "extractor=random-conv"))])
def test_offloaded_client_state_is_bit_identical_to_resident(run_record, tmp_path, monkeypatch, method, args):
    from hfl_bench import evaluation

    monkeypatch.setattr(evaluation, "RESOLVE_CHUNK", 3)  # 8 clients: validation in three chunks
    resident = run_record("-m", method, *BASE, *args, out=tmp_path / "resident")
    for mode in ("host", "disk"):  # host on the CPU is a copy in the same memory: the same code path
        record = run_record("-m", method, *BASE, *args, "--client-state", mode, out=tmp_path / mode)
        assert record["status"] == "ok" and record["federation"]["client_state"] == mode
        assert figures(record) == figures(resident), mode
        assert record["config"]["client_state"] == mode
    assert "client_state" not in resident["federation"]  # the default: records as they were
    assert not any((tmp_path / "disk" / ".client-state").iterdir())  # the run's folder went with it


@pytest.mark.parametrize("method,pool", [("fedavg", "cpu-cnn"), ("fml", None)])
def test_a_broadcast_round_brings_back_only_the_clients_it_draws(tmp_path, monkeypatch, method, pool):
    """FedAvg's broadcast (FML's meme broadcast) reaches a client's model (meme) when the client is
    drawn, and every client is evaluated with the server's: a round under disk state reads back its
    active clients alone (FML's memes offloaded with their clients)."""
    from hfl_bench import engine

    sim = engine.Simulation(engine.load_task(RunConfig(
        method=method, pool=pool, task="digits", clients=12, clients_per_round=3, rounds=30, seed=0,
        local_epochs=1, batch_size=64, lr=0.01, eval_every=10, eval_clients=2, client_state="disk",
        out=str(tmp_path)))[1])
    sim.step(1)
    restored: list[int] = []
    restore = ClientStore.restore
    monkeypatch.setattr(ClientStore, "restore", lambda self, c: restored.append(c.cid) or restore(self, c))
    for rnd in (2, 3):
        restored.clear()
        sim.step(rnd)
        assert sorted(restored) == sorted(sim.drawn_clients(rnd)), rnd
    if method == "fml":  # the memes wait where their clients wait
        away = [c.cid for c in sim.fed.clients if c.store is not None]
        assert away and all(p.numel() == 0 for c in away for p in sim.method.memes[c].parameters())
    sim.close()



def _row_copies(evaluator) -> int:
    """Bytes of the training-set rows the evaluator holds as its own tensors (not the data's)."""
    data = evaluator.fed.data.train_x.untyped_storage().data_ptr()
    held = [v for v in vars(evaluator).values() if isinstance(v, torch.Tensor)]
    held += [t for v in vars(evaluator).values() if isinstance(v, list)
             for pair in v if isinstance(pair, tuple) for t in pair if isinstance(t, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held
                if t.is_floating_point() and t.dim() == 4}
    return sum(n for ptr, n in storages.items() if ptr != data)


@pytest.mark.parametrize("mode", ["resident", "disk"])
def test_under_client_state_the_evaluator_keeps_no_copy_of_every_clients_rows(tmp_path, mode):
    """Resident, each client's validation and local test rows are laid out once per run (N copies);
    under --client-state they are gathered when a client is measured, so the evaluator's memory does
    not grow with N (the figures are the resident ones: the test above)."""
    from hfl_bench import engine

    sim = engine.Simulation(engine.load_task(RunConfig(
        method="local", task="digits", clients=12, clients_per_round=3, rounds=30, seed=0, local_epochs=1,
        batch_size=64, lr=0.01, eval_every=10, eval_clients=2, client_state=mode, out=str(tmp_path)))[1])
    sim.step(1)
    rows = sum(len(c.val_idx) + len(c.test_idx) for c in sim.fed.clients)
    row_bytes = sim.fed.data.train_x[0].numel() * sim.fed.data.train_x.element_size()
    held = _row_copies(sim.evaluator)
    assert held == (rows * row_bytes if mode == "resident" else 0)
    sim.close()

def test_disk_state_is_written_atomically_and_checked_before_it_is_trusted(tmp_path):
    fed = cpu_federation(RunConfig(task="digits", clients=2, rounds=1, seed=0, local_epochs=1, batch_size=64))
    store = ClientStore("disk", tmp_path)
    store.attach(fed, "local")
    client = fed.clients[0]
    before = [t.detach().clone() for t in client._model.state_dict().values()]
    store.offload(client)
    assert all(p.numel() == 0 for p in client._model.parameters())  # the device's copy is freed
    assert [p.name for p in tmp_path.iterdir()] == ["client-0.pt"]  # no temporary left
    client.model  # reading it brings it back, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(before, client._model.state_dict().values()))
    store.offload(client)
    with torch.no_grad():  # calling the model (a predictor that holds it) brings it back too
        client._model.eval()(fed.data.train_x[:2])
    assert client.store is None and all(p.numel() for p in client._model.parameters())
    store.offload(client)
    path = tmp_path / "client-0.pt"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ClientStateError, match="client 0's state file client-0.pt is not the one written"):
        client.model


def test_clients_sharing_model_tensors_are_refused_for_offloading(tmp_path):
    fed = cpu_federation(RunConfig(task="digits", clients=2, rounds=1, seed=0, local_epochs=1, batch_size=64))
    fed.clients[1].model = fed.clients[0].model
    with pytest.raises(ValueError, match="clients 0 and 1 share model tensors.*--client-state resident"):
        ClientStore("host").attach(fed, "shared")


def test_sampled_evaluation_tests_a_seeded_sample_and_every_client_in_the_final_window(run_record, tmp_path):
    full = run_record("-m", "local", *BASE, out=tmp_path / "full")
    sampled = run_record("-m", "local", *BASE, "--eval-clients", "3", out=tmp_path / "sampled")
    again = run_record("-m", "local", *BASE, "--eval-clients", "3", "--client-state", "disk", out=tmp_path / "again")
    assert sampled["federation"]["eval_clients"] == 3 and "eval_clients" not in full["federation"]
    assert sampled["config_hash"] != full["config_hash"]  # hash-relevant when set
    assert figures(again) == figures(sampled)  # the same seed draws the same clients
    by_round = {e["round"]: e for e in full["history"]}
    for entry in sampled["history"]:
        mine = by_round[entry["round"]]
        assert entry["mean_val_acc"] == mine["mean_val_acc"]  # training and selection never move
        if entry["round"] > 2:  # the final window (rounds 3..12): every client, the same figures
            assert entry["global_acc"] == mine["global_acc"] and len(entry["client_global_acc"]) == 8
    # rounds 0 and 2 tested 3 clients: not the 8 clients' mean
    assert [sampled["history"][r]["global_acc"] != full["history"][r]["global_acc"] for r in (0, 2)] == [True, True]
    assert sampled["metrics"] == full["metrics"] and sampled["selection"] == full["selection"]
    # the view states it
    result, out, _ = invoke_cli("show", str(next((tmp_path / "sampled").glob("*.json"))))
    assert result.exit_code == 0, out
    assert "a seeded 3 clients each" in out and "client state" not in out
    result, out, _ = invoke_cli("show", str(next((tmp_path / "again").glob("*.json"))))
    assert "a seeded 3 clients each" in out and "disk" in out
    result, out, _ = invoke_cli("leaderboard", "show", str(tmp_path))
    assert result.exit_code == 0, out
    assert "eval=3" in out


def test_the_sample_is_seeded_by_run_seed_and_round_and_moves_no_other_stream():
    from hfl_bench.evaluation import Evaluator

    fed = cpu_federation(RunConfig(task="digits", clients=8, rounds=30, seed=5, local_epochs=1, batch_size=64,
                                   eval_clients=3))
    ev = Evaluator(fed, fed.timer, 2)
    state = torch.get_rng_state(), np.random.get_state()[1].copy()
    draws = [ev.sample(r) for r in (0, 2, 4)]
    assert torch.equal(state[0], torch.get_rng_state()) and (state[1] == np.random.get_state()[1]).all()
    assert draws == [ev.sample(r) for r in (0, 2, 4)] and all(len(d) == 3 for d in draws)
    assert len({tuple(d) for d in draws}) > 1  # a new draw each round
    assert ev.sample(21) is None and ev.sample(30) is None and ev.sample(4, last=True) is None  # final window: all


def test_eval_clients_hash_only_when_set_and_a_sample_of_all_is_all():
    from hfl_bench.config import resolve

    cfg = RunConfig(task="digits", clients=8, rounds=12, seed=0)
    plain = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("eval_clients", "client_state",
                                                                           "client_state_dir")}
    assert config_hash(dataclasses.asdict(cfg)) == config_hash(plain)  # existing hashes do not move
    offloaded = dataclasses.replace(cfg, client_state="disk", client_state_dir="elsewhere")
    assert config_hash(dataclasses.asdict(offloaded)) == config_hash(plain)
    assert resolve(dataclasses.replace(cfg, eval_clients=8), {}).eval_clients is None
    assert resolve(dataclasses.replace(cfg, eval_clients=3), {}).eval_clients == 3


@pytest.mark.parametrize("args, message", [
    (("--eval-clients", "0"), "--eval-clients must be >= 1, got 0"),
    (("--client-state", "cloud"), "--client-state must be resident, host, disk, got 'cloud'"),
])
def test_bad_scale_options_are_one_line_and_exit_2(tmp_path, args, message):
    result, out, err = invoke_cli("run", *BASE, *args, "--out", str(tmp_path), "-q")
    assert result.exit_code == 2
    assert message in (err or out) and len((err or out).strip().splitlines()) == 1


def test_tiny_clients_keep_a_validation_and_a_local_test_sample():
    labels = np.repeat(np.arange(10), 5)  # 50 samples, five of each class: each class's share rounds to 0 test
    split = split_client(np.arange(50), labels, 0.2, np.random.default_rng(0))
    assert len(split.val) == 10 and len(split.test) == 1 and len(split.train) == 39
    three = split_client(np.arange(3), np.array([0, 1, 2]), 0.2, np.random.default_rng(0))
    assert (len(three.train), len(three.val), len(three.test)) == (1, 1, 1)
    two = split_client(np.arange(2), np.array([0, 1]), 0.2, np.random.default_rng(0))
    assert len(two.val) == len(two.test) == 0  # under three samples: nothing to spare
    # 1,000 clients of ~50 (the pfl-research shape on 50,000 labels): every one has both
    big = make_partition(np.random.default_rng(1).integers(0, 10, 50_000), 1000, "iid", seed=0, heldout_fraction=0.2)
    assert all(len(c.val) and len(c.test) for c in big.clients)


def test_a_large_federation_runs_with_disk_state_and_sampled_evaluation(run_record, tmp_path):
    record = run_record("-m", "local", "-t", "digits", "--clients", "200", "--clients-per-round", "10",
                        "--eval-clients", "10", "--client-state", "disk", "--rounds", "11", "--eval-every", "1",
                        "--local-epochs", "1", "--batch-size", "64", "--lr", "0.01", "--checkpoint-every", "0",
                        out=tmp_path)
    assert record["status"] == "ok" and record["federation"]["client_state"] == "disk"
    assert len(record["history"][-1]["client_global_acc"]) == 200
    assert not any(Path(tmp_path, ".client-state").iterdir())


def test_checkpoint_and_resume_with_disk_state_give_the_resident_figures(tmp_path):
    from hfl_bench import engine
    from hfl_bench.recording import build_record

    def config(mode: str) -> RunConfig:
        return engine.load_task(RunConfig(method="crad", task="digits", clients=6, clients_per_round=2, rounds=6,
                                          seed=0, local_epochs=1, batch_size=64, lr=0.01, eval_every=2,
                                          eval_clients=2, client_state=mode, out=str(tmp_path / mode)))[1]

    resident = build_record(config("resident"), engine.run(config("resident"), checkpoint=tmp_path / "r.ckpt"))
    first = engine.Simulation(config("disk"))
    for rnd in range(1, 4):
        first.step(rnd)
    first.save_checkpoint(tmp_path / "d.ckpt")  # with every client offloaded after round 3
    first.close()
    resumed = engine.Simulation(config("disk"))
    resumed.load_checkpoint(tmp_path / "d.ckpt")
    record = build_record(config("disk"), resumed.run())
    history = lambda r: [{k: v for k, v in e.items() if k not in ("seconds", "phases")} for e in r["history"]]  # noqa: E731
    assert history(record) == history(resident) and record["metrics"] == resident["metrics"]
    assert not any((tmp_path / "disk" / ".client-state").iterdir())


# local; local with --ensemble (a predictor over every client's model: resolved in one chunk);
# fedproto (wrappers, an extra endpoint, and every client's predictor changes each round: validated in chunks)
@pytest.mark.parametrize("method,ensemble", [("local", False), ("local", True), ("fedproto", False),
                                             ("fedsocket", False)])
def test_a_snapshot_pins_offloaded_clients_and_resolves_them_in_chunks_to_the_resident_figures(
        tmp_path, monkeypatch, method, ensemble):
    """A best round that is not fully tested, with 12 clients and 3 active: under disk state the
    snapshot copies only the clients resident when it is taken, pins the others' files (which their
    next offload does not overwrite), and its figures, resolved 5 clients at a time, are the ones a
    resident run computes from its full copies."""
    from hfl_bench import engine, evaluation

    monkeypatch.setattr(evaluation, "RESOLVE_CHUNK", 5)
    sizes = []  # the chunk sizes the disk run's resolution used
    chunks = evaluation.Evaluator._resolve_chunks
    monkeypatch.setattr(evaluation.Evaluator, "_resolve_chunks",
                        lambda self, snap, wanted, size: sizes.append(size) or chunks(self, snap, wanted, size))

    def simulation(mode: str) -> engine.Simulation:
        return engine.Simulation(engine.load_task(RunConfig(
            method=method, task="digits", clients=12, clients_per_round=3, rounds=30, seed=0, local_epochs=1,
            batch_size=64, lr=0.01, eval_every=10, eval_clients=2, client_state=mode, ensemble=ensemble,
            method_params={"extractor": "random-conv"} if method == "fedsocket" else {},
            out=str(tmp_path / mode)))[1])

    runs = {mode: simulation(mode) for mode in ("resident", "disk")}
    resolved = {}
    for mode, sim in runs.items():
        sim.step(1)  # round 1 improves on round 0 and is not a test round: snapshotted
        snap = sim.evaluator.pending
        assert snap is not None and snap.round == 1
        if mode == "disk":
            store = sim.store
            # fedproto's new prototypes changed every client's predictor: validated 5 at a time, each
            # chunk offloaded again after it, so its inactive clients are pinned like local's
            assert 0 < len(snap.pins) < 12 and set(snap.pins).isdisjoint(sim.drawn_clients(1))
            pinned = {id(m) for c in snap.pins for m in client_modules(sim.fed.clients[c])}
            assert not {id(m) for m, _ in snap.states} & pinned
            # a pinned client's model and the modules it holds (fedsocket's Q) are not copied, nor
            # brought back by the snapshot: the copies hold none of their tensors
            assert not {k for m, state in snap.states for k in state
                        if any(id(sub) in pinned for sub in _path_modules(m, k))}
            assert all(sim.fed.clients[c].store is not None for c in snap.pins)
            files = {h.stored[0]: h.stored[0].read_bytes() for h in snap.pins.values()}
        for rnd in (2, 3):  # other clients train and are offloaded again; the snapshot still stands
            sim.step(rnd)
            if sim.evaluator.pending is not snap:  # a better round: a new snapshot
                snap = sim.evaluator.pending
        if mode == "disk" and snap.round == 1:
            assert all(path.read_bytes() == data for path, data in files.items())  # pinned: left as it was
        resolved[mode] = (snap.round, sim.evaluator.resolve())
        assert sim.evaluator.pending is None
        if mode == "disk":
            assert not store._pinned  # released
            held_files = {h.stored[0] for h in store._held.values()}
            assert set(store.folder.iterdir()) == held_files  # nothing left behind but what clients hold
            assert all(c.store is not None for c in sim.fed.clients if c.cid in snap.pins)  # offloaded again
        sim.close()
    # in chunks of 5; --ensemble's predictor runs every model: tried in chunks, then in one chunk
    assert sizes == ([5, 12] if ensemble else [5])
    (r_round, r), (d_round, d) = resolved["resident"], resolved["disk"]
    assert r_round == d_round
    for field in ("val_acc", "local_acc", "global_acc", "global_class_acc", "seen_acc", "unseen_acc"):
        np.testing.assert_array_equal(getattr(d, field), getattr(r, field), err_msg=field)
    assert d.endpoints == r.endpoints and not np.isnan(d.global_acc).any()
    assert set(r.endpoint_clients) == ({"head"} if method == "fedproto" else {"ensemble"} if ensemble else
                                       {"private", "q", "joint"} if method == "fedsocket" else set())
    for name in r.endpoint_clients:
        for key in r.endpoint_clients[name]:
            np.testing.assert_array_equal(d.endpoint_clients[name][key], r.endpoint_clients[name][key])


def _path_modules(module: torch.nn.Module, key: str) -> list[torch.nn.Module]:
    """The modules on a state key's path inside ``module`` (``q_predictor.q.expert.weight``: the
    module itself, its ``q_predictor``, that one's ``q`` and its ``expert``)."""
    out = [module]
    for part in key.split(".")[:-1]:
        out.append(getattr(out[-1], part))
    return out
