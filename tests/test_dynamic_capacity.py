"""Dynamic capacity (HeteroFL's 'dynamic' mode, ``capacity=dynamic``; ``hfl_bench.families.submodel``):
the per-round draw (seeded, reproducible, different across rounds, in proportion to the shares),
the optimizer state carried to a sub-model of another width, every client at one level equal to
the fixed mode bit for bit through the real CLI, the record's per-round levels, the config hash
(unchanged where the setting is not used), a resumed dynamic run equal to an uninterrupted one,
and depthfl's one-line refusal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hfl_bench.families.submodel import (
    LEVELS,
    carry_optimizer_state,
    draw_rates,
    parse_profile,
    window,
)
from hfl_bench.training import derive_seed

from helpers import QUICK, figures, quick_run

RATE_LEVEL = {rate: level for level, rate in LEVELS.items()}


def test_draws_are_seeded_differ_by_round_and_follow_the_shares():
    profile = parse_profile("a1-b1-c1-d1-e1")
    draws = [draw_rates(profile, 20, seed=3, rnd=r) for r in range(1, 6)]
    assert draws == [draw_rates(profile, 20, seed=3, rnd=r) for r in range(1, 6)]  # reproducible
    assert len({tuple(d) for d in draws}) == 5  # a new draw every round
    assert draws[0] != draw_rates(profile, 20, seed=4, rnd=1)  # another seed, another draw
    assert all(r in LEVELS.values() for d in draws for r in d)
    # shares as probabilities: a3-e1 gives about three a for each e
    many = draw_rates(parse_profile("a3-e1"), 4000, seed=0, rnd=1)
    assert 0.72 < many.count(1.0) / 4000 < 0.78 and set(many) == {1.0, 0.0625}
    assert draw_rates(parse_profile("c1"), 7, seed=0, rnd=9) == [0.25] * 7  # one level: always it


def test_optimizer_state_follows_the_entries_to_another_width():
    axes = {"h.weight": (0, None), "h.bias": (0,)}
    full = {"h.weight": torch.Size([4, 2]), "h.bias": torch.Size([4])}
    small, wide = torch.nn.Module(), torch.nn.Module()
    small.h, wide.h = torch.nn.Linear(2, 2), torch.nn.Linear(2, 3)
    old, new = torch.optim.SGD(small.parameters(), lr=0.1, momentum=0.9), torch.optim.SGD(wide.parameters(), lr=0.1)
    old.state[small.h.bias]["momentum_buffer"] = torch.tensor([5.0, 6.0])  # global channels 2, 3
    old.state[small.h.weight]["momentum_buffer"] = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    carry_optimizer_state(old, small, new, wide, axes, full, {0: window(4, 2, 2)}, {0: window(4, 3, 1)})
    # now channels 1, 2, 3: channel 1 is new to the client (0), 2 and 3 keep theirs
    assert new.state[wide.h.bias]["momentum_buffer"].tolist() == [0.0, 5.0, 6.0]
    assert new.state[wide.h.weight]["momentum_buffer"].tolist() == [[0.0, 0.0], [1.0, 2.0], [3.0, 4.0]]
    # Adam: its moments move the same way, its step count is kept
    adam = torch.optim.Adam(small.parameters(), lr=0.1)
    small.h.bias.grad, small.h.weight.grad = torch.ones(2), torch.ones(2, 2)
    adam.step()
    wide_adam = torch.optim.Adam(wide.parameters(), lr=0.1)
    carry_optimizer_state(adam, small, wide_adam, wide, axes, full, {0: window(4, 2, 2)}, {0: window(4, 3, 1)})
    moved = wide_adam.state[wide.h.bias]
    assert moved["exp_avg"].tolist() == pytest.approx([0.0, 0.1, 0.1]) and float(moved["step"]) == 1.0


def run(out: Path, method: str, *args: str) -> dict:
    return quick_run(out, "--method", method, *args)


@pytest.mark.parametrize("method", ["heterofl", "fjord"])
def test_every_client_at_one_level_is_the_fixed_mode_bit_for_bit(method, tmp_path):
    fixed = run(tmp_path / "fixed", method, "--set", "profile=c1")
    dynamic = run(tmp_path / "dynamic", method, "--set", "profile=c1", "--set", "capacity=dynamic")
    assert figures(dynamic) == figures(fixed)
    details = dynamic["method"]["run_details"]
    assert details["capacity"] == "dynamic" and details["round_levels"] == ["cccc"] * 3
    assert "round_levels" not in fixed["method"]["run_details"]  # the fixed mode's record as it was
    assert dynamic["config_hash"] != fixed["config_hash"]  # a dynamic run is its own config


def test_dynamic_levels_are_redrawn_each_round_and_recorded(tmp_path):
    a = run(tmp_path / "a", "fedrolex", "--set", "capacity=dynamic")
    from hfl_bench import run as api_run

    # the Python API names it as it names the profile (method_params): the same run, drawn again
    again = api_run(method="fedrolex", task="digits", clients=4, rounds=3, out=str(tmp_path / "again"),
                    method_params={"capacity": "dynamic"}).data
    other = run(tmp_path / "other", "fedrolex", "--set", "capacity=dynamic", "--seed", "1")
    levels = a["method"]["run_details"]["round_levels"]
    profile = parse_profile("a1-b1-c1-d1-e1")
    seed = derive_seed(0, "capacity")
    assert levels == ["".join(RATE_LEVEL[r] for r in draw_rates(profile, 4, seed, rnd)) for rnd in (1, 2, 3)]
    assert len(set(levels)) == 3  # a new draw every round
    assert a["method"]["run_details"]["client_rates"] == draw_rates(profile, 4, seed, 4)  # the held (next) draw
    assert again["method"]["run_details"] == a["method"]["run_details"] and figures(again) == figures(a)
    assert other["method"]["run_details"]["round_levels"] != levels
    # the same draws whichever method runs them: heterofl's record names the same levels
    hetero = run(tmp_path / "hetero", "heterofl", "--set", "capacity=dynamic")
    assert hetero["method"]["run_details"]["round_levels"] == levels


def test_capacity_fixed_keeps_the_hash_it_always_had(tmp_path):
    plain = run(tmp_path / "plain", "heterofl")
    named = run(tmp_path / "named", "heterofl", "--set", "capacity=fixed")
    assert named["config_hash"] == plain["config_hash"]
    assert plain["config"]["method_params"] == {} == named["config"]["method_params"]


def test_a_resumed_dynamic_run_equals_an_uninterrupted_one(tmp_path):
    from test_resume import assert_same_run, config

    from hfl_bench import checkpoint, engine, paths
    from hfl_bench import recording as records

    cfg = config("heterofl", tmp_path, method_params={"capacity": "dynamic"})
    full = records.build_record(cfg, engine.run(cfg))
    path = paths.checkpoint_path(cfg)
    assert checkpoint.read(path)["round"] == 2
    levels = full["method"]["run_details"]["round_levels"]
    assert levels[1] != levels[2]  # the resumed round's clients hold other widths than round 2's
    resumed = records.build_record(cfg, engine.run(cfg, resume=True))
    assert resumed["federation"]["resumed_from_rounds"] == [2]
    assert_same_run(full, resumed)


@pytest.mark.parametrize("method,says", [
    ("depthfl", "depthfl: capacity=dynamic is not built for the depth family"),
    ("heterofl", "heterofl: capacity must be fixed or dynamic, got 'sometimes'"),
])
def test_a_mode_it_cannot_run_is_one_line_and_exit_2(method, says, tmp_path):
    value = "dynamic" if method == "depthfl" else "sometimes"
    proc = subprocess.run([sys.executable, "-m", "hfl_bench.cli", "run", "--method", method, *QUICK,
                           "--out", str(tmp_path), "--set", f"capacity={value}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert not list(tmp_path.glob("*.json"))
