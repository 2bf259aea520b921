"""``leaderboard rankings``: the rankings by final accuracy, time to local and worst 10% side by
side, per device setting (``results.rankings``). Through the real CLI on records real runs wrote
(digits, three clients, three rounds, every round tested): local, crad and fedproto on seeds 0-1
under ``uniform`` and under ``mixed-phones --device-assignment by-size``, each preset in its own
folder (without a deadline a run under two presets is the same record file); fedavg on one
architecture under mixed-phones (its own setting section, alone: no ranking); crad on seed 0
without devices (no clock). Every expected figure and rank is computed here from the records; the
ranking logic alone on a case where the three orders differ."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.results.fairness import client_accuracies, worst10
from hfl_bench.results.rankings import Entry, changes, notes, rank_entries, shared_ranks
from hfl_bench.results.setting import Stat
from hfl_bench.results.timing import final_global, time_to_accuracy

from helpers import invoke_cli

PROTOCOL = ("--task", "digits", "--rounds", "3", "--eval-every", "1", "--clients", "3", "-q")
PRESETS = {"uniform": ("--devices", "uniform"),
           "mixed-phones": ("--devices", "mixed-phones", "--device-assignment", "by-size")}
METHODS = ("local", "crad", "fedproto")
SEEDS = (0, 1)


# The board's fourteen real runs take minutes on a loaded machine: the CLI tests are slow; the logic tests are not.
slow = pytest.mark.slow


def _run(out: Path, method: str, seed: int, *args: str) -> dict:
    result, stdout, _ = invoke_cli("run", *PROTOCOL, "--method", method, "--seed", str(seed), "--out", str(out), *args)
    assert result.exit_code == 0, stdout
    (path,) = out.glob(f"digits__{method}__*seed{seed}.json")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("rankings") / "board"
    out: dict = {"base": base}
    for preset, args in PRESETS.items():
        out[preset] = {m: {s: _run(base / preset, m, s, *args) for s in SEEDS} for m in METHODS}
    out["fedavg"] = _run(base / "mixed-phones", "fedavg", 0, "--pool", "cpu-cnn", *PRESETS["mixed-phones"])
    out["plain"] = _run(base / "none", "crad", 0)  # no clock
    return out


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, ["leaderboard", "rankings", *args], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return result.stdout


def expected(records: dict) -> dict[str, dict]:
    """Each method's three figures by hand from its records (``records``: method -> seed -> record)."""
    out = {}
    for m, seeds in records.items():
        accs = [r["metrics"]["final"]["global_acc"] for r in seeds.values()]
        times = [time_to_accuracy(r, final_global(records["local"][s])) for s, r in seeds.items()]
        worst = [worst10(client_accuracies(r).values()) for r in seeds.values()]
        out[m] = {"acc": statistics.fmean(accs), "times": times, "worst": statistics.fmean(worst)}
    return out


def by_rank(values: dict[str, float], higher_first: bool) -> dict[str, float]:
    return shared_ranks({m: (-1 if higher_first else 1) * round(v, 4) for m, v in values.items()})


@slow
@pytest.mark.parametrize("preset", list(PRESETS))
def test_each_device_setting_is_ranked_three_ways_from_its_own_records(board, preset):
    data = json.loads(cli(str(board["base"]), "--json"))
    label = "uniform, random" if preset == "uniform" else "mixed-phones, by-size"
    [table] = [t for t in data["tables"] if t["devices"] == label]
    assert table["task"] == "digits" and table["section"].startswith("data-free, heterogeneous pool")
    got = {m["method"]: m for m in table["methods"]}
    assert set(got) == set(METHODS)
    want = expected(board[preset])
    for m, w in want.items():
        assert got[m]["seeds"] == 2
        assert got[m]["global_acc"]["mean"] == pytest.approx(w["acc"], abs=1e-4)
        assert got[m]["worst10"]["mean"] == pytest.approx(w["worst"], abs=1e-4)
        reached = [t for t in w["times"] if t is not None]
        assert got[m]["time_to_local"]["seeds_with_target"] == 2 and got[m]["time_to_local"]["n"] == len(reached)
        if reached:
            assert got[m]["time_to_local"]["mean"] == pytest.approx(statistics.fmean(reached), abs=1e-4)
    # the ranks, by hand: accuracy and worst 10% higher first, time by share reached then mean time
    acc_ranks = by_rank({m: w["acc"] for m, w in want.items()}, higher_first=True)
    worst_ranks = by_rank({m: w["worst"] for m, w in want.items()}, higher_first=True)
    time_keys = {m: (round(1 - sum(t is not None for t in w["times"]) / 2, 4),
                     round(statistics.fmean(t for t in w["times"] if t is not None), 4)
                     if any(t is not None for t in w["times"]) else math.inf) for m, w in want.items()}
    time_ranks = shared_ranks(time_keys)
    for m in METHODS:
        assert got[m]["global_acc"]["rank"] == acc_ranks[m]
        assert got[m]["worst10"]["rank"] == worst_ranks[m]
        assert got[m]["time_to_local"]["rank"] == time_ranks[m]
    assert [m["method"] for m in table["methods"]] == sorted(METHODS, key=lambda m: (acc_ranks[m], m))
    assert len(table["changes"]) == 2 and table["changes"][0].startswith("by time to local")


@slow
def test_the_presets_times_differ_and_accuracy_does_not(board):
    """The clock only observes: the same accuracies under both presets, other simulated times."""
    data = json.loads(cli(str(board["base"]), "--json"))
    tables = {t["devices"]: {m["method"]: m for m in t["methods"]} for t in data["tables"]}
    uni, mixed = tables["uniform, random"], tables["mixed-phones, by-size"]
    assert all(uni[m]["global_acc"] == mixed[m]["global_acc"] for m in METHODS)
    assert uni["crad"]["time_to_local"]["mean"] != mixed["crad"]["time_to_local"]["mean"]


@slow
def test_other_sections_and_records_without_a_clock_stay_apart(board):
    data = json.loads(cli(str(board["base"]), "--json"))
    assert {t["devices"] for t in data["tables"]} == {"uniform, random", "mixed-phones, by-size"}
    alone = {(a["method"], a["devices"]) for a in data["alone"]}
    # fedavg on one architecture: its own section, no rival there; crad without devices: alone in "none"
    assert alone == {("fedavg", "mixed-phones, by-size"), ("crad", "none")}
    [fedavg] = [a for a in data["alone"] if a["method"] == "fedavg"]
    assert "single architecture" in fedavg["section"]


@slow
def test_plain_lines_markdown_and_filters(board):
    lines = cli(str(board["base"]))  # piped: plain lines
    header = "method | seeds | # acc | # time | # worst | global acc | time to local (s) | worst 10%"
    assert lines.count(header) == 2
    assert "one method only, no ranking: fedavg on digits, devices: mixed-phones, by-size" in lines
    assert any(line.startswith("by worst 10%") for line in lines.splitlines())
    markdown = cli(str(board["base"]), "--format", "markdown", "--devices", "uniform")
    assert markdown.count("| method | seeds | # acc |") == 1 and "mixed-phones" not in markdown
    only = json.loads(cli(str(board["base"]), "--json", "--devices", "none"))
    assert only["tables"] == [] and [a["method"] for a in only["alone"]] == ["crad"]


@slow
@pytest.mark.parametrize("args, said", [
    (("--task", "digit"), "unknown task 'digit'. Did you mean 'digits'?"),
    (("--devices", "mixed"), "unknown device profile 'mixed'"),
    (("--format", "csv"), "unknown --format 'csv'"),
])
def test_bad_input_is_one_line_and_exit_2(board, args, said):
    result = CliRunner().invoke(app, ["leaderboard", "rankings", str(board["base"]), *args])
    assert result.exit_code == 2 and said in result.output, result.output


# ----------------------------------------------------------------------------- the logic alone


def _entry(method: str, acc: float, times: list, worst, with_target: int = 3, time_state: str = "") -> Entry:
    reached = [t for t in times if t is not None]
    return Entry(method, None, 3, Stat.of([acc]), Stat.of(reached), with_target,
                 time_state or ("" if reached or not with_target else "not reached"),
                 Stat.of([worst]), "" if worst is not None else "not recorded")


def test_three_orders_that_differ_ties_and_missing_figures():
    entries = [
        _entry("a", 90.0, [10.0, 12.0, 11.0], 40.0),    # best accuracy, slow, worst clients poor
        _entry("b", 85.0, [2.0, 3.0, 4.0], 70.0),       # fastest, best worst clients
        _entry("c", 85.0, [1.0, None, 1.0], 60.0),      # ties b on accuracy; reached on 2 of 3 seeds only
        _entry("d", 80.0, [None, None, None], 60.0),    # never reaches local's figure: last by time
        _entry("e", 70.0, [], None, with_target=0, time_state="not available"),  # no target, no per-client
    ]
    rank_entries(entries)
    ranks = {e.method: e.ranks for e in entries}
    assert {m: r["global_acc"] for m, r in ranks.items()} == {"a": 1, "b": 2.5, "c": 2.5, "d": 4, "e": 5}
    # every seed reached first (b, then a), then c (2 of 3), then d (none); e is not ranked
    assert {m: r["time_to_local"] for m, r in ranks.items()} == {"a": 2, "b": 1, "c": 3, "d": 4, "e": None}
    assert {m: r["worst10"] for m, r in ranks.items()} == {"a": 4, "b": 1, "c": 2.5, "d": 2.5, "e": None}
    by_time, by_worst = changes(entries)
    assert by_time == ("by time to local vs final accuracy: b up 1.5 (2.5 -> 1), a down 1 (1 -> 2), "
                       "c down 0.5 (2.5 -> 3); 1 other keeps its place")
    assert by_worst == ("by worst 10% vs final accuracy: a down 3 (1 -> 4), b up 1.5 (2.5 -> 1), "
                        "d up 1.5 (4 -> 2.5); 1 other keeps its place")
    said = notes(entries)
    assert "never reached local's final accuracy (ranked last by time, tied): d" in said
    assert "not ranked by time to local (not available): e" in said
    assert "not ranked by worst 10% (not recorded): e" in said
    assert any(line.endswith("c 2/3") for line in said)


def test_methods_that_never_reach_it_tie_last_and_the_same_order_is_said():
    entries = [_entry("a", 90.0, [1.0], 50.0, 1), _entry("b", 80.0, [None], 40.0, 1),
               _entry("c", 70.0, [None], 30.0, 1)]
    rank_entries(entries)
    assert [e.ranks["time_to_local"] for e in entries] == [1, 2.5, 2.5]
    assert changes(entries)[1] == "by worst 10%: the same order as by final accuracy (3 methods)"


def test_a_line_names_the_five_biggest_moves_and_counts_the_rest():
    entries = [_entry(f"m{i}", 80.0 - 10 * i, [1.0], 10.0 * i, 1) for i in range(1, 8)]  # worst 10% reversed
    rank_entries(entries)
    assert changes(entries)[1] == ("by worst 10% vs final accuracy: m7 up 6 (7 -> 1), m1 down 6 (1 -> 7), "
                                   "m6 up 4 (6 -> 2), m2 down 4 (2 -> 6), m5 up 2 (5 -> 3); 1 more moves by 2 places "
                                   "or fewer; 1 other keeps its place")


def test_device_setting_labels():
    from hfl_bench.results.rankings import device_setting, profile_name

    file_clock = {"profile": "phones.yaml", "preset": False, "profile_sha256": "0123456789abcdef",
                  "assignment": "random", "deadline_s": 30.0}
    assert device_setting({"clock": file_clock}) == "phones.yaml (01234567), random, deadline 30 s"
    preset = {"profile": "mixed-phones", "preset": True, "assignment": "by-size", "deadline_s": None}
    assert device_setting({"clock": preset}) == "mixed-phones, by-size"
    assert device_setting({}) == "none" and profile_name({}) == "none" and profile_name({"clock": file_clock}) == \
        "phones.yaml"
