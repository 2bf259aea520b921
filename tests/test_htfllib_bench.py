"""The HtFLlib comparison scripts' own logic (benchmarks/): reading HtFLlib's options from its
main.py, timing its server's rounds, and the side-by-side summary. HtFLlib itself is not needed:
a main.py and a server of the same shape stand in for it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_htfllib  # noqa: E402
import htfllib_driver  # noqa: E402
import htfllib_side_by_side as sbs  # noqa: E402

MAIN_PY = '''
import argparse
def run(args):
    raise NotImplementedError
if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument('-algo', "--algorithm", type=str, default="FedAvg")
    parser.add_argument('-lbs', "--batch_size", type=int, default=10)
    parser.add_argument('-ab', "--auto_break", type=bool, default=False)
    parser.add_argument('-lam', "--lamda", type=float, default=1.0)
    other.add_argument('--not-htfllib', default=1)
    args = parser.parse_args()
    run(args)
'''


def test_parser_has_exactly_main_py_options(tmp_path):
    (tmp_path / "main.py").write_text(MAIN_PY)
    parser = htfllib_driver.htfllib_parser(tmp_path / "main.py")
    args = parser.parse_args(["-algo", "FedProto", "-lam", "10"])
    assert (args.algorithm, args.batch_size, args.lamda, args.auto_break) == ("FedProto", 10, 10.0, False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--not-htfllib", "2"])  # only the calls on `parser` are HtFLlib's options


class FakeServer:
    """HtFLlib's loop shape: each round starts with select_clients, evaluates through test_metrics."""

    def __init__(self, rounds):
        self.rounds = rounds

    def select_clients(self):
        return [0, 1]

    def test_metrics(self):
        return [0, 1], [10, 30], [5.0, 27.0], [0.0, 0.0]

    def train(self):
        for _ in range(self.rounds + 1):
            self.select_clients()
            self.test_metrics()


def test_instrument_emits_one_record_per_round(capsys, monkeypatch):
    server = FakeServer(rounds=2)
    monkeypatch.setattr(sys, "stdin", io.StringIO("go\ngo\ngo\n"))
    htfllib_driver.instrument(server, gate=True)
    server.train()
    server._driver_close_round()
    recs = [json.loads(line.split(" ", 1)[1]) for line in capsys.readouterr().out.splitlines()
            if line.startswith(htfllib_driver.MARK)]
    assert [r["round"] for r in recs] == [0, 1, 2]
    assert all(r["acc"] == pytest.approx(32 / 40) and r["test_sizes"] == [10, 30] for r in recs)
    assert all(r["seconds"] >= r["evaluation_s"] >= 0 for r in recs)


def test_gate_stops_between_rounds_when_stdin_closes(monkeypatch):
    server = FakeServer(rounds=5)
    monkeypatch.setattr(sys, "stdin", io.StringIO("go\n"))
    htfllib_driver.instrument(server, gate=True)
    with pytest.raises(SystemExit):
        server.train()


def test_side_by_side_summary():
    runs = {sbs.key("fd", "htfllib", s): {"curve": c, "seconds": [0, 2, 2]}
            for s, c in ((0, [10, 50, 60]), (1, [10, 70, 60]))}
    runs |= {sbs.key("fd", "hfl_bench", s): {"curve": c, "seconds": [0, 1, 1]}
             for s, c in ((0, [10, 40, 62]), (1, [12, 60, 64]))}
    s = sbs.summarize(runs, ["fd"], [0, 1])["fd"]
    assert s["htfllib"]["mean_curve"] == [10, 60, 60] and s["hfl_bench"]["mean_curve"] == [11, 50, 63]
    assert s["htfllib"]["best_acc"] == 65 and s["htfllib"]["best_rounds"] == [2, 1]
    assert s["hfl_bench"]["best_acc"] == 63 and s["best_diff"] == -2
    assert s["mean_abs_curve_diff"] == pytest.approx((1 + 10 + 3) / 3, abs=1e-3)


def test_round_to_round_change_is_taken_after_the_climb():
    curve = [0, 30, 50, 60, 65, 70, 72, 70, 74]  # rounds 6-8 change by 2, 2 and 4 after round 5
    assert sbs.round_to_round(curve) == pytest.approx(8 / 3)
    assert sbs.round_to_round(curve[:6]) is None
    runs = {sbs.key("fd", "htfllib", s): {"curve": c, "seconds": [1] * 9} for s, c in enumerate((curve, curve[:6]))}
    assert sbs.summarize(runs, ["fd"], [0, 1])["fd"]["htfllib"]["round_to_round"] == pytest.approx(2.67)


def test_tested_rounds_of_a_300_round_run():
    assert bench_htfllib.tested_rounds_in(300, 10) == 39  # every 10th (29 before the window) and the last 10
    assert bench_htfllib.tested_rounds_in(300, 1) == 300


def test_live_summary_ratios():
    pair = lambda tested, s: {"load_1min": [1, 1], "htfllib": {"seconds": 100, "cpu_s": 80},  # noqa: E731
                              "hfl_bench": {"tested": tested, "s": s, "cpu_s": s * 0.8}}
    out = bench_htfllib.summarize([pair(False, 40), pair(False, 40), pair(True, 140)], n_tested=39)
    assert out["wall"]["tested_ratio"] == 1.4
    assert out["wall"]["amortized_round"] == pytest.approx((261 * 40 + 39 * 140) / 300, abs=0.01)
    assert out["cpu"]["amortized_ratio"] == out["wall"]["amortized_ratio"]


@pytest.mark.slow  # the script as processes
def test_side_by_side_report_rows_come_from_the_summary(tmp_path):
    runs = {sbs.key("fd", side, s): {"curve": c, "seconds": [0, 1, 1, 1]}
            for side, curves in (("htfllib", ([10, 50, 60, 70], [10, 70, 60, 72])),
                                 ("hfl_bench", ([10, 40, 62, 71], [12, 60, 64, 69])))
            for s, c in enumerate(curves)}
    doc = {"settings": {"rounds": 3, "lr": 0.01, "batch_size": 10, "local_epochs": 1, "clients": 20,
                        "htfllib_commit": "6e6f1aef"}, "summary": sbs.summarize(runs, ["fd"], [0, 1])}
    out = tmp_path / "sbs.json"
    out.write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, str(BENCH / "htfllib_side_by_side.py"), "--report", "--out", str(out)],
                          capture_output=True, text=True, check=True)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| fd |")]
    assert ("| mean abs. curve difference | rounds 1-3 | rounds 1-5 | largest (round) | round-to-round change after "
            "round 5 (HtFLlib / hfl-bench) |") in proc.stdout
    # best: (70 + 72) / 2 = 71 vs (71 + 69) / 2 = 70; curves [10, 60, 60, 71] vs [11, 50, 63, 70]:
    # |differences| 1, 10, 3, 1, so 15 / 4 over rounds 0-3 and 14 / 3 over rounds 1-3 (and 1-5)
    assert rows[0] == "| fd | 2 / 2 | 71.00 | 70.00 | -1.00 | 3.75 | 4.67 | 4.67 | -10.00 (1) | - / - |"  # 3 rounds
    assert rows[1] == "| fd | 10.00 / 11.00 | 60.00 / 50.00 | 60.00 / 63.00 | 71.00 / 70.00 |"
    # a file's runs are summarized anew (a file written by an earlier harness has an older summary)
    out.write_text(json.dumps(doc | {"runs": runs, "summary": {}}))
    proc = subprocess.run([sys.executable, str(BENCH / "htfllib_side_by_side.py"), "--report", "--out", str(out)],
                          capture_output=True, text=True, check=True)
    again = [line for line in proc.stdout.splitlines() if line.startswith("| fd |")]
    assert again[:2] == rows and again[2].startswith("| fd | -10.00 [-70.85, +50.85] |")  # + round 1's interval


def test_cifar10_folder_is_pfllib_layout_that_the_task_reads(tmp_path):
    import numpy as np
    import pfl_cifar10

    from hfl_bench.data import get_task

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(10), 60)
    x = rng.uniform(0, 1, size=(len(y), 3, 32, 32)).astype(np.float32)
    config = pfl_cifar10.write_folder(x, y, tmp_path / "f", seed=3, clients=5)
    data = get_task("pfl-npz-cifar10").load(tmp_path / "f")  # checks the label counts against config.json
    sizes = [len(i) for i in data.client_indices]
    totals = [sum(k for _, k in c) for c in config["Size of samples for labels in clients"]]
    assert sum(totals) == len(y) and min(totals) >= pfl_cifar10.LEAST_SAMPLES
    assert all(abs(n - 0.75 * t) <= 0.5 for n, t in zip(sizes, totals))  # 75 / 25 per client
    assert len(data.test_y) == len(y) - sum(sizes)
    first = data.train_y[data.client_indices[0]].numpy()
    assert (np.diff(first) < 0).any()  # files in random order, not by class (HtFLlib's loaders do not shuffle)
    again = pfl_cifar10.client_splits(y, seed=3, clients=5)
    assert [len(tr) for tr, _ in again] == sizes  # seeded: the same split again


def test_driver_builds_htfllib_fedavgcnn_for_the_image_shape():
    import htfllib_run

    def flag(cmd, name):
        return cmd[cmd.index(name) + 1]

    mnist = htfllib_run.driver_command("FD", 3, 10, 1, 0.01, 20, [])
    cifar = htfllib_run.driver_command("FD", 3, 10, 1, 0.01, 20, [], image_shape=(3, 32, 32))
    assert (flag(mnist, "--in-features"), flag(mnist, "--dim")) == ("1", "1024")
    assert (flag(cifar, "--in-features"), flag(cifar, "--dim")) == ("3", "1600")
    assert htfllib_driver.MODEL.format(in_features=3, dim=1600) == \
        "FedAvgCNN(in_features=3, num_classes=args.num_classes, dim=1600)"


def test_merge_joins_runs_of_one_setting_and_refuses_others():
    def doc(method, curve, **settings):
        runs = {sbs.key(method, side, 0): {"curve": curve, "seconds": [0, 1]} for side in ("htfllib", "hfl_bench")}
        return {"settings": {"rounds": 1, "data": "abc", **settings, "hfl_bench_params": {method: []}}, "runs": runs}

    merged = sbs.merge([doc("fd", [10, 50]), doc("local", [10, 60])])
    assert sorted(merged["summary"]) == ["fd", "local"] and len(merged["runs"]) == 4
    assert merged["settings"]["hfl_bench_params"] == {"fd": [], "local": []}
    with pytest.raises(ValueError, match="different settings"):
        sbs.merge([doc("fd", [10, 50]), doc("local", [10, 60], data="other")])
    with pytest.raises(ValueError, match="run fd/htfllib/seed0 differs"):
        sbs.merge([doc("fd", [10, 50]), doc("fd", [10, 51])])
    other_params = doc("fd", [10, 50])
    other_params["settings"]["hfl_bench_params"] = {"fd": ["temperature=2"]}
    with pytest.raises(ValueError, match="fd's hfl-bench parameters differ"):
        sbs.merge([doc("fd", [10, 50]), other_params])


def test_plot_draws_methods_with_both_sides_and_refuses_none(tmp_path):
    runs = {sbs.key(m, side, 0): {"curve": [10, 50, 60], "seconds": [0, 1, 1]}
            for m in ("fd", "local") for side in ("htfllib", "hfl_bench")}
    runs[sbs.key("fedgh", "htfllib", 0)] = {"curve": [10, 40, 50], "seconds": [0, 1, 1]}  # one side only
    settings = {"rounds": 2, "clients": 20, "htfllib_commit": "6e6f1aef", "task": "pfl-npz"}
    doc = {"settings": settings, "summary": sbs.summarize(runs, ["fd", "local", "fedgh"], [0])}
    sbs.plot(doc, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no method has runs on both sides"):
        sbs.plot({"settings": settings, "summary": {}}, tmp_path / "none.png")


def test_resume_keeps_htfllib_runs_when_only_hfl_bench_settings_change():
    runs = {sbs.key("fd", side, 0): {"curve": [1]} for side in ("htfllib", "hfl_bench")}
    settings = {k: 1 for k in sbs.HTFLLIB_SETTINGS if k not in sbs.SETTING_DEFAULTS}
    settings |= {"heldout_fraction": 0.2, "hfl_bench_params": {"fd": []}}
    doc = {"settings": settings, "runs": runs}
    assert sbs.resumable(doc, settings | {"hfl_bench_params": {"fd": ["lam=2"]}}) == runs  # checked per method later
    assert list(sbs.resumable(doc, settings | {"heldout_fraction": 0.05})) == ["fd/htfllib/seed0"]
    assert sbs.resumable(doc, settings | {"rounds": 2}) == {}
    # a setting added later (hfl_bench_init) reads as its old value in files written before it
    assert sbs.resumable(doc, settings | {"hfl_bench_init": "own"}) == runs
    assert list(sbs.resumable(doc, settings | {"hfl_bench_init": "shared"})) == ["fd/htfllib/seed0"]
    # HtFLlib's loader (added later too): its own reads as the old files; the diagnostic one keeps nothing
    assert sbs.resumable(doc, settings | {"htfllib_loader": "as-is"}) == runs
    assert sbs.resumable(doc, settings | {"htfllib_loader": "shuffled"}) == {}
    assert sbs.resumable(doc, settings | {"htfllib_tgp_protos": "as-is"}) == runs
    assert sbs.resumable(doc, settings | {"htfllib_tgp_protos": "after-training"}) == {}


CLIENTBASE = """
import torch
from torch.utils.data import DataLoader, TensorDataset
class Client:
    batch_size = 10
    def load_train_data(self, batch_size=None):
        data = TensorDataset(torch.arange(25))
        return DataLoader(data, batch_size or self.batch_size, drop_last=True, shuffle=False)
"""


def test_driver_shuffled_loader_reshuffles_every_epoch_and_keeps_the_last_batch(tmp_path, monkeypatch):
    """``--loader shuffled`` (a diagnostic) replaces the training loader every HtFLlib client
    inherits, on a stand-in ``flcore.clients.clientbase`` of HtFLlib's shape."""
    import torch

    (tmp_path / "flcore" / "clients").mkdir(parents=True)
    (tmp_path / "flcore" / "clients" / "clientbase.py").write_text(CLIENTBASE)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("flcore", "flcore.clients", "flcore.clients.clientbase"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    from flcore.clients import clientbase

    epoch = lambda: [int(v) for (b,) in clientbase.Client().load_train_data() for v in b]  # noqa: E731
    assert epoch() == list(range(20))  # HtFLlib's own: fixed order, the last 5 dropped
    monkeypatch.setattr(clientbase.Client, "load_train_data", clientbase.Client.load_train_data)  # undone after
    htfllib_driver.shuffle_training_loader()
    torch.manual_seed(0)
    first, second = epoch(), epoch()
    assert sorted(first) == sorted(second) == list(range(25)) and first != second != list(range(25))


SHARED_INIT_PROBE = """
import argparse, json, sys
import torch
sys.path.insert(0, sys.argv[1])
import htfllib_side_by_side as sbs
states = {}
for shared in (False, True):
    args = argparse.Namespace(worker="fedproto", data=sys.argv[2], set=[], standardize=False, shared_init=shared,
                              heldout_fraction=0.3, rounds=1, seed=0, eval_every=0)
    states[shared] = [c.model.state_dict() for c in sbs.simulation(args, "pfl-npz-cifar10").fed.clients]
same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a)
print(json.dumps({"shared": [same(states[True][0], s) for s in states[True][1:]],
                  "own": [same(states[False][0], s) for s in states[False][1:]],
                  "first_is_own_draw": same(states[True][0], states[False][0])}))
"""


@pytest.mark.slow  # a process
def test_shared_init_starts_every_client_from_client_0s_model(tmp_path):
    """``--shared-init``: hfl-bench's clients start from one model, as HtFLlib's do; by default each
    client draws its own. Through the engine, on a small folder in the PFLlib layout, in a process
    of its own as the harness's worker runs (it replaces the data module's standardization and
    registers the benchmark's pool, which no later test may see)."""
    import numpy as np
    import pfl_cifar10

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(10), 30)
    pfl_cifar10.write_folder(rng.uniform(-1, 1, size=(len(y), 3, 32, 32)).astype(np.float32), y,
                             tmp_path / "f", seed=0, clients=3)
    proc = subprocess.run([sys.executable, "-c", SHARED_INIT_PROBE, str(BENCH), str(tmp_path / "f")],
                          capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"shared": [True, True], "own": [False, False], "first_is_own_draw": True}


CLIENTTGP = """
class clientTGP:
    saved = "initial model"
    def train(self):
        trained = "trained model"
        self.collect_protos()  # HtFLlib's order: before the trained model is saved
        self.saved = trained
    def collect_protos(self):
        self.uploaded = "prototypes of the " + self.saved  # HtFLlib reads the model back from disk
"""


def test_driver_tgp_protos_after_training_uploads_the_trained_models_prototypes(tmp_path, monkeypatch):
    """``--tgp-protos after-training`` (a diagnostic) moves FedTGP's ``collect_protos`` after the
    trained model is saved, on a stand-in ``flcore.clients.clienttgp`` of HtFLlib's order."""
    (tmp_path / "flcore" / "clients").mkdir(parents=True)
    (tmp_path / "flcore" / "clients" / "clienttgp.py").write_text(CLIENTTGP)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("flcore", "flcore.clients", "flcore.clients.clienttgp"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    from flcore.clients.clienttgp import clientTGP

    client = clientTGP()
    client.train()
    assert client.uploaded == "prototypes of the initial model"  # HtFLlib's own: one round behind
    monkeypatch.setattr(clientTGP, "train", clientTGP.train)  # undone after
    htfllib_driver.tgp_protos_after_training()
    client = clientTGP()
    client.train()
    assert client.uploaded == "prototypes of the trained model" and "collect_protos" not in vars(client)


def test_a_diagnostic_file_borrows_hfl_bench_runs_from_files_of_the_same_settings():
    """``--hfl-bench-from``: a diagnostic run of HtFLlib's side alone is compared with hfl-bench's runs
    of a file whose settings differ only in HtFLlib's diagnostics; other settings are refused."""
    settings = {"rounds": 2, "lr": 0.01, "batch_size": 10, "local_epochs": 1, "clients": 20,
                "htfllib_commit": "6e6f1aef", "hfl_bench_params": {"fedproto": []}}
    probe = {"settings": settings | {"htfllib_loader": "shuffled"},
             "runs": {sbs.key("fedproto", "htfllib", 0): {"curve": [0, 50, 60], "seconds": [0, 1, 1]}}}
    lanes = {"settings": settings | {"hfl_bench_params": {"fedproto": [], "fd": []}},
             "runs": {sbs.key(m, side, s): {"curve": [10, 40, 70], "seconds": [0, 1, 1]}
                      for m in ("fedproto", "fd") for side in ("htfllib", "hfl_bench") for s in (0, 1)}}
    doc = sbs.borrow_hfl_bench(probe, [lanes])
    assert sorted(doc["runs"]) == ["fedproto/hfl_bench/seed0", "fedproto/htfllib/seed0"]  # its methods and seeds
    assert doc["runs"]["fedproto/htfllib/seed0"]["curve"] == [0, 50, 60]  # its own HtFLlib run, not the lanes'
    assert doc["summary"]["fedproto"]["best_diff"] == 10
    assert "(diagnostics: loader shuffled)" in sbs.report(doc)
    assert "diagnostics" not in sbs.report(lanes | {"summary": sbs.summarize(lanes["runs"], ["fd"], [0])})
    with pytest.raises(ValueError, match="other settings"):
        sbs.borrow_hfl_bench(probe, [lanes | {"settings": lanes["settings"] | {"rounds": 3}}])
    with pytest.raises(ValueError, match="parameters differ"):
        sbs.borrow_hfl_bench(probe, [lanes | {"settings": settings | {"hfl_bench_params": {"fedproto": ["lam=1"]}}}])


@pytest.mark.slow  # the script as a process
def test_report_gives_each_round_welchs_interval_and_the_rounds_it_resolves_before_and_after_holm(tmp_path):
    """``--report``'s interval table: hfl-bench minus HtFLlib per round with Welch's 95% interval over
    the two sides' seeds (scipy's, checked by hand at one round), the rounds clear of 0 listed per
    side, unadjusted and after Holm's adjustment; no table under two seeds a side."""
    from scipy import stats

    htfllib = [[0, 10, 60, 70, 80, 81, 80], [0, 12, 61, 71, 80, 79, 81], [0, 11, 62, 69, 80, 80, 80]]
    hfl_bench = [[10, 50, 60, 71, 81, 80, 70], [10, 52, 62, 70, 79, 81, 71], [10, 51, 61, 72, 80, 79, 69]]
    runs = {sbs.key("fedtgp", side, s): {"curve": c, "seconds": [1] * 7}
            for side, curves in (("htfllib", htfllib), ("hfl_bench", hfl_bench)) for s, c in enumerate(curves)}
    doc = {"settings": {"rounds": 6, "lr": 0.01, "batch_size": 10, "local_epochs": 1, "clients": 20,
                        "htfllib_commit": "6e6f1aef"}, "runs": runs}
    doc["summary"] = sbs.summary_of(runs)
    iv = sbs.round_intervals(doc, "fedtgp")
    ci = stats.ttest_ind([50, 52, 51], [10, 12, 11], equal_var=False).confidence_interval(0.95)
    assert iv[1][:3] == pytest.approx((40.0, ci.low, ci.high))
    row = next(line for line in sbs.report(doc).splitlines() if line.startswith("| fedtgp | +40.00 ["))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # rounds 1-5, then: hfl-bench above, HtFLlib above, the two after Holm, the largest after round 5
    assert cells[6:10] == ["1", "6", "1", "6"] and cells[10].startswith("-10.33 [") and cells[10].endswith("(6)")
    assert sbs._spans([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10" and sbs._spans([]) == "none"
    one_seed = {"settings": doc["settings"], "runs": {k: v for k, v in runs.items() if k.endswith("seed0")}}
    assert sbs.round_intervals(one_seed, "fedtgp") is None
    assert "Welch" not in sbs.report(one_seed | {"summary": sbs.summary_of(one_seed["runs"])})
    # --overview: one table over files, a row per file and method, Holm's rounds from the same intervals
    for name, d in (("three.json", doc), ("one.json", one_seed | {"settings": doc["settings"] | {"task": "pfl-npz"}})):
        (tmp_path / name).write_text(json.dumps(d))
    proc = subprocess.run([sys.executable, str(BENCH / "htfllib_side_by_side.py"), "--overview",
                           str(tmp_path / "three.json"), str(tmp_path / "one.json")],
                          capture_output=True, text=True, check=True)
    rows = [line for line in proc.stdout.splitlines() if "| fedtgp |" in line]
    # mean curves' |differences| over rounds 1-6: 40, 0, 1, 0, 0, 10.33 (seed 0 alone: 40, 0, 1, 1, 1, 10)
    assert rows == ["| pfl-npz | fedtgp | 3 / 3 | 80.67 | 80.67 | +0.00 | 8.56 | 1 | 6 |",
                    "| pfl-npz | fedtgp | 1 / 1 | 81.00 | 81.00 | +0.00 | 8.83 | - | - |"]
