"""The simulated clock (``hfl_bench.clock``, schema 1.10): device profiles (presets, files, FedScale
availability traces), their seeded generation and assignment, round times by hand on a 2-client
run, a deadline dropping the late client, the same training with and without devices, and the
views' time-to-accuracy computed by hand on records the CLI wrote."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from hfl_bench import clock
from hfl_bench.config import ConfigError
from hfl_bench.record.model import record_problems
from hfl_bench.record.upgrade import STEPS
from hfl_bench.results.loading import load_record
from hfl_bench.results.timing import accuracy_at, time_to_accuracy, total_time

from helpers import REAL_RECORD, REPO, invoke_cli, straight_and_resumed

SPEED, UP, DOWN, LATENCY = 2e9, 1e5, 4e5, 0.5
PROTOCOL = ("--task", "digits", "--rounds", "3", "--eval-every", "1", "-q")


def _profile(folder: Path, **extra) -> Path:
    path = folder / "phones.yaml"
    path.write_text("devices:\n"
                    f"  - {{name: toy, flops_per_s: {SPEED}, up_bytes_per_s: {UP}, down_bytes_per_s: {DOWN}, "
                    f"latency_s: {LATENCY}}}\n" + "".join(f"{k}: {v}\n" for k, v in extra.items()))
    return path


def _run(out: Path, *args: str, clients: int = 2) -> dict:
    result, stdout, _ = invoke_cli("run", *PROTOCOL, "--clients", str(clients), "--out", str(out), *args)
    assert result.exit_code == 0, stdout
    (path,) = out.glob("*.json")
    record = json.loads(path.read_text())
    assert record["schema_version"] == "1.11" and record_problems(record) == []
    return record


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("clock")
    profile = _profile(base)
    out = {"base": base, "profile": profile}
    out["local"] = _run(base / "board" / "local", "--method", "local", "--devices", str(profile))
    out["crad"] = _run(base / "plain" / "crad", "--method", "crad")
    out["crad_devices"] = _run(base / "board" / "crad", "--method", "crad", "--devices", "mixed-phones")
    return out


def _samples_per_round(record: dict) -> list[float]:
    budget = record["cost"]["budget"]
    return [s / budget["rounds"] for s in budget["per_client"]["private"]["samples"]]


# ----------------------------------------------------------------------------- the clock by hand


def test_a_round_time_by_hand():
    # client 0: 4e9 FLOPs at 2e9 FLOP/s (2 s), 1e5 bytes up at 1e5 B/s (1 s), 8e5 down at 4e5 B/s (2 s),
    # latency 0.5 s: 5.5 s; client 1: 1e9 FLOPs (0.5 s), nothing sent, 0.5 s latency: 1 s
    dev = clock.Device("toy", SPEED, UP, DOWN, LATENCY)
    c = clock.Clock(clock.Profile("toy", (dev,)), [dev, dev], "random", 0, None, [0.0, 0.0])
    entry = c.round_entry([0, 1], [], [4e9, 1e9], [1e5, 0.0], [8e5, 0.0], [])
    # beside each time, what it was computed from (hfl-bench reclock times the round again from these)
    assert entry == {"start_s": 0.0, "seconds": 5.5, "clients": [5.5, 1.0], "dropped": [],
                     "flops": [4e9, 1e9], "up_bytes": [1e5, 0.0], "down_bytes": [8e5, 0.0]}
    later = c.round_entry([1], [], [0.0, 1e9], [0.0, 0.0], [0.0, 0.0], [{"clock": entry}])
    assert later == {"start_s": 5.5, "seconds": 1.0, "clients": [None, 1.0], "dropped": [],
                     "flops": [None, 1e9], "up_bytes": [None, 0.0], "down_bytes": [None, 0.0]}
    # a deadline the estimate of client 0 (its last measured time, 5.5 s) exceeds drops it, and the round
    # then lasts the deadline: the server waited for it
    timed = clock.Clock(clock.Profile("toy", (dev,)), [dev, dev], "random", 0, 3.0, [0.0, 0.0])
    assert timed.admit([0, 1], [{"clock": entry}]) == ([1], [0])
    assert timed.round_entry([1], [0], [0.0, 1e9], [0.0] * 2, [0.0] * 2, [])["seconds"] == 3.0


def test_a_two_client_run_times_each_round_by_hand(runs):
    record = runs["local"]
    per_sample = record["cost"]["flops"]["per_sample"]["training"]
    samples = _samples_per_round(record)
    expected = [per_sample[c] * samples[c] / SPEED + LATENCY for c in range(2)]  # local sends nothing
    section = record["clock"]
    assert section["profile"] == "phones.yaml" and section["preset"] is False and len(section["profile_sha256"]) == 64
    assert section["devices"] == [{"name": "toy", "flops_per_s": SPEED, "up_bytes_per_s": UP, "down_bytes_per_s": DOWN,
                                   "latency_s": LATENCY, "availability": False}] * 2
    assert section["deadline_s"] is None and section["rule"] is None and "not modelled" in section["server"]
    rounds = [h["clock"] for h in record["history"][1:]]
    for r, entry in enumerate(rounds):
        assert entry["clients"] == pytest.approx(expected, rel=1e-5)
        assert entry["seconds"] == pytest.approx(max(expected), rel=1e-5)
        assert entry["start_s"] == pytest.approx(r * max(expected), rel=1e-5)
    assert section["per_round_s"] == [e["seconds"] for e in rounds]
    assert section["total_s"] == pytest.approx(3 * max(expected), rel=1e-5)
    assert "clock" not in record["history"][0]  # round 0 (the initial evaluation) is not timed


def test_a_deadline_drops_the_late_client_every_round(runs, tmp_path):
    first = runs["local"]
    n_train = [sum(c) for c in first["partition"]["train_counts"]]
    per_sample = first["cost"]["flops"]["per_sample"]["training"]
    epochs = first["config"]["local_epochs"]
    # before its first round, a client's expected time is its local epochs over its private training samples
    estimate = [per_sample[c] * epochs * n_train[c] / SPEED + LATENCY for c in range(2)]
    assert estimate == pytest.approx(first["history"][1]["clock"]["clients"], rel=1e-5)  # local trains just that
    late = max(range(2), key=lambda c: estimate[c])
    assert estimate[late] > estimate[1 - late]
    deadline = round((estimate[0] + estimate[1]) / 2, 3)
    record = _run(tmp_path, "--method", "local", "--devices", str(runs["profile"]), "--deadline", str(deadline))
    assert record["clock"]["deadline_s"] == deadline and record["clock"]["rule"] == clock.RULE
    for h in record["history"][1:]:
        assert h["clock"]["dropped"] == [late] and h["clock"]["clients"][late] is None
        assert h["clock"]["seconds"] == deadline  # the server waits for the late client until the deadline
    assert record["cost"]["budget"]["per_client"]["private"]["samples"][late] == 0  # it never trained
    kept = record["cost"]["budget"]["per_client"]["private"]["samples"][1 - late]
    assert kept == first["cost"]["budget"]["per_client"]["private"]["samples"][1 - late]
    assert record["config_hash"] != first["config_hash"]  # a deadline changes training: hashed


def test_devices_without_a_deadline_change_nothing_about_training(runs):
    plain, timed = runs["crad"], runs["crad_devices"]
    assert "clock" not in plain and all("clock" not in h for h in plain["history"])
    assert timed["config_hash"] == plain["config_hash"]  # the clock only observes: same run, same hash
    assert timed["config"]["devices"] == "mixed-phones" and plain["config"]["devices"] == ""
    keys = ("mean_val_acc", "global_acc", "local_acc", "client_global_acc", "client_local_acc", "bytes")
    assert [{k: h.get(k) for k in keys} for h in timed["history"]] == [{k: h.get(k) for k in keys}
                                                                        for h in plain["history"]]
    assert timed["metrics"] == plain["metrics"] and timed["cost"]["budget"] == plain["cost"]["budget"]


# ----------------------------------------------------------------------------- profiles


def test_presets_are_generated_from_the_seed():
    mixed = clock.load_profile("mixed-phones")
    a, b, c = (clock.generate(mixed, 10, s) for s in (0, 0, 1))
    assert a == b and a != c
    assert [d.name for d in a] == ["phone-high"] * 4 + ["phone-mid"] * 3 + ["phone-low"] * 3  # equal shares
    speeds = {d.name: d.flops_per_s for d in mixed.classes}
    assert speeds["phone-high"] / speeds["phone-mid"] >= 2 and speeds["phone-mid"] / speeds["phone-low"] >= 2
    uniform = clock.generate(clock.load_profile("uniform"), 5, 3)
    assert len(set(uniform)) == 1  # every client the same device
    assert clock.assign(a, "random", 0, [1] * 10) == clock.assign(a, "random", 0, [1] * 10)
    assert clock.assign(a, "random", 0, [1] * 10) != clock.assign(a, "random", 1, [1] * 10)
    by_size = clock.assign(a, "by-size", 0, [5, 1, 9, 1, 1, 1, 1, 1, 1, 1])
    fastest = sorted(a, key=lambda d: -d.flops_per_s)
    assert by_size[2] == fastest[0] and by_size[0] == fastest[1]  # the largest architectures, the fastest devices
    assert clock.counts([1, 1, 1], 10) == [4, 3, 3] and clock.counts([3, 1], 2) == [2, 0]


def test_by_size_puts_the_largest_architecture_on_the_fastest_phone(tmp_path):
    record = _run(tmp_path, "--method", "local", "--devices", "mixed-phones", "--device-assignment", "by-size",
                  clients=3)
    flops = record["cost"]["flops"]["per_sample"]["training"]
    speeds = [d["flops_per_s"] for d in record["clock"]["devices"]]
    assert sorted(range(3), key=lambda c: -flops[c]) == sorted(range(3), key=lambda c: -speeds[c])
    assert record["clock"]["assignment"] == "by-size" and record["clock"]["seed"] == record["config"]["seed"]


# ----------------------------------------------------------------------------- FedScale's traces

TRACE = {"0": {"active": [0, 100], "inactive": [50, 150], "finish_time": 200},
         "1": {"active": [10], "inactive": [20], "finish_time": 40}}


def test_a_fedscale_layout_trace_loads_and_repeats(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(TRACE))
    traces = clock.load_trace(path)
    assert traces["0"] == {"active": [0.0, 100.0], "inactive": [50.0, 150.0], "finish_time": 200.0}
    t0 = traces["0"]
    assert [clock.trace_active(t0, t) for t in (0, 49.9, 50, 99, 100, 150, 200, 260)] == [
        True, True, False, False, True, False, True, False]  # it repeats every finish_time
    assert [clock.trace_active(traces["1"], t) for t in (5, 10, 19, 20, 55)] == [False, True, True, False, True]
    (tmp_path / "bad.json").write_text(json.dumps({"0": {"active": [5], "inactive": [1], "finish_time": 9}}))
    with pytest.raises(ConfigError, match="alternate"):
        clock.load_trace(tmp_path / "bad.json")


def test_the_pickle_converter_reads_plain_data_only(tmp_path):
    script = REPO / "benchmarks" / "fedscale_trace_to_json.py"
    fedscale = {int(k): v for k, v in TRACE.items()}  # FedScale's keys are client ids
    (tmp_path / "client_behave_trace").write_bytes(pickle.dumps(fedscale))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "client_behave_trace"),
                           str(tmp_path / "t.json")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert clock.load_trace(tmp_path / "t.json") == clock.load_trace(_write(tmp_path / "ref.json", TRACE))
    (tmp_path / "evil").write_bytes(pickle.dumps({0: Path("x")}))  # a class: never constructed
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "evil"), str(tmp_path / "e.json")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "only plain data" in done.stderr and not (tmp_path / "e.json").exists()


def _write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_a_profile_with_traces_makes_unavailable_clients_miss_a_deadlined_round(tmp_path):
    _write(tmp_path / "trace.json", {"0": {"active": [0], "inactive": [1e9], "finish_time": 2e9},
                                     "1": {"active": [1e9], "inactive": [2e9], "finish_time": 2e9}})
    profile = _profile(tmp_path, traces="trace.json")
    record = _run(tmp_path / "out", "--method", "local", "--devices", str(profile), "--deadline", "1000")
    assert [d["availability"] for d in record["clock"]["devices"]] == [True, True]
    assert all(h["clock"]["dropped"] == [1] for h in record["history"][1:])  # client 1 is never available


@pytest.mark.parametrize("text, said", [
    ("devices: []\n", "non-empty list"),
    ("devices:\n  - {name: a, flops_per_s: 0, up_bytes_per_s: 1, down_bytes_per_s: 1}\n", "flops_per_s must be > 0"),
    ("devices:\n  - {name: a, flops_per_s: 1, up_bytes_per_s: 1}\n", "missing down_bytes_per_s"),
    ("devices:\n  - {name: a, flops_per_s: 1, up_bytes_per_s: 1, down_bytes_per_s: 1, speed: 2}\n",
     "unknown field speed"),
    ("devices:\n  - {name: a, flops_per_s: x, up_bytes_per_s: 1, down_bytes_per_s: 1}\n", "must be a finite number"),
    ("phones: 1\n", "a profile is an object"),
    ("devices: [1\n", "phones.yaml"),
])
def test_a_bad_profile_is_one_line_and_exit_2(tmp_path, text, said):
    path = tmp_path / "phones.yaml"
    path.write_text(text)
    result, stdout, stderr = invoke_cli("run", *PROTOCOL, "--method", "local", "--devices", str(path),
                                        "--out", str(tmp_path / "out"))
    message = (stderr or stdout).strip()
    assert result.exit_code == 2 and said in message and len(message.splitlines()) == 1, message
    assert not (tmp_path / "out").exists()  # refused before any data loads


@pytest.mark.parametrize("args, said", [
    (("--devices", "no-such-preset"), "neither a preset"),
    (("--deadline", "5"), "--deadline needs --devices"),
    (("--devices", "uniform", "--deadline", "0"), "--deadline must be > 0"),
    (("--devices", "uniform", "--device-assignment", "fastest"), "--device-assignment must be random or by-size"),
])
def test_bad_clock_settings_are_one_line_and_exit_2(tmp_path, args, said):
    result, stdout, stderr = invoke_cli("run", *PROTOCOL, "--method", "local", *args, "--out", str(tmp_path))
    message = (stderr or stdout).strip()
    assert result.exit_code == 2 and said in message and len(message.splitlines()) == 1, message


# ----------------------------------------------------------------------------- records and views


def test_an_old_record_reads_as_not_recorded(tmp_path):
    record = load_record(REAL_RECORD)
    assert record["schema_version"] == "1.11" and "clock" not in record and total_time(record) is None
    assert STEPS["1.9"]({"schema_version": "1.9", "cost": {}}) == {"schema_version": "1.10", "cost": {}}
    result, stdout, _ = invoke_cli("leaderboard", "show", str(REAL_RECORD), "--clock", "--format", "json")
    assert result.exit_code == 0, stdout
    (group,) = json.loads(stdout)["groups"]
    assert group["sim_time"]["state"] == group["time_to_local"]["state"] == "not recorded"
    assert group["sim_time"]["mean"] is None  # never 0


def test_time_to_accuracy_by_hand_through_show(runs):
    local, crad = runs["local"], runs["crad_devices"]
    target = local["metrics"]["final"]["global_acc"]  # local's final figure, the same seed and protocol
    ends = [0.0] + [h["clock"]["start_s"] + h["clock"]["seconds"] for h in crad["history"][1:]]
    accs = [h["global_acc"] for h in crad["history"]]
    by_hand = next((t for t, a in zip(ends, accs) if a >= target), None)
    assert time_to_accuracy(crad, target) == by_hand
    budget = ends[2]  # the end of round 2: its accuracy is the last within budget
    assert accuracy_at(crad, budget) == accs[2] and accuracy_at(crad, ends[1] / 2) == accs[0]
    result, stdout, _ = invoke_cli("leaderboard", "show", str(runs["base"] / "board"), "--clock", "--time-budget",
                                   str(budget), "--format", "json")
    assert result.exit_code == 0, stdout
    groups = {g["method"]: g for g in json.loads(stdout)["groups"]}
    got = groups["crad"]
    assert got["sim_time"]["mean"] == pytest.approx(crad["clock"]["total_s"], abs=1e-4)  # Stat's 4 decimals
    assert got["acc_at_budget"]["mean"] == pytest.approx(accs[2], abs=1e-4)
    if by_hand is None:
        assert got["time_to_local"]["state"] == "not reached"
    else:
        assert got["time_to_local"]["mean"] == pytest.approx(by_hand, abs=1e-4)
    assert got["clock"]["per_seed"][0]["target"] == target
    # the default view has no time column; --clock adds them to the table
    result, default, _ = invoke_cli("leaderboard", "show", str(runs["base"] / "board"), "--format", "markdown")
    assert result.exit_code == 0 and "sim time" not in default and "time to local" not in default
    result, chosen, _ = invoke_cli("leaderboard", "show", str(runs["base"] / "board"), "--format", "markdown",
                                   "--clock")
    assert result.exit_code == 0 and "| sim time (s) | time to local (s) | acc @ time budget |" in chosen
    assert "no --time-budget" in chosen


def test_the_python_api_and_a_suite_take_the_same_keys(tmp_path):
    import hfl_bench

    record = hfl_bench.run(method="local", task="digits", clients=2, rounds=1, out=str(tmp_path / "api"),
                           devices="uniform", device_assignment="by-size")
    assert record.data["clock"]["assignment"] == "by-size" and record.data["clock"]["profile"] == "uniform"
    suite = tmp_path / "suite.yaml"
    suite.write_text("name: clock\nmethods: [local]\ntasks: [digits]\nseeds: [0]\n"
                     "settings: {clients: 2, rounds: 1, devices: uniform, deadline: 100}\n")
    result, stdout, _ = invoke_cli("matrix", str(suite), "--out", str(tmp_path / "suite"), "-q")
    assert result.exit_code == 0, stdout
    (path,) = (tmp_path / "suite").rglob("*.json")
    assert json.loads(path.read_text())["clock"]["deadline_s"] == 100


def test_a_resumed_run_keeps_its_clock(tmp_path):
    # the clock is rebuilt from the history a checkpoint holds: a run resumed after round 1 times
    # rounds 2 and 3 as the run that never stopped
    from hfl_bench.resolved import resolve_run

    cfg = resolve_run({"method": "crad", "task": "digits", "clients": 2, "rounds": 3, "devices": "mixed-phones",
                       "deadline": 2.0, "out": str(tmp_path)}).cfg
    straight, resumed = straight_and_resumed(cfg, tmp_path / "ckpt.pt", rounds=3, stop=1)
    assert [h["clock"] for h in resumed.history[1:]] == [h["clock"] for h in straight.history[1:]]
    assert resumed.clock.record(resumed.history) == straight.clock.record(straight.history)
