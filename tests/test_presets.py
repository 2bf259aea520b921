"""One budget by default, a paper's own settings as a named preset (issue 30).

A method card declares presets (``MethodCard.presets``); ``run --preset NAME`` fills those
hyperparameters (an explicit ``--set`` wins), the preset is part of the run's identity through
the values it sets (``--preset paper`` and the same values by ``--set`` are one run, one hash, one
recorded preset), an unknown preset is one line and exit 2, and the methods whose defaults moved to
the protocol's budget run at their defaults and with their ``paper`` preset.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from hfl_bench import engine
from hfl_bench.config import ConfigError, RunConfig, config_hash, param
from hfl_bench.method_api import MethodCard, get_method_class
from hfl_bench.method_card import card_problems, matching_preset, preset_params_problems
from hfl_bench.testing import QUICK, builtin_methods, smoke_config

from helpers import invoke_cli

# The methods whose defaults moved to the protocol's budget (their 1.0 settings: the paper preset).
BUMPED = ("fedcc", "fedmd", "fedsocket", "naive-shared")


@dataclass
class _Params:
    optimizer: str = param("sgd", "Optimizer.")
    epochs: int | None = param(None, "Epochs; unset: the run's.")
    lam: float = param(0.5, "Weight.")


def _card(**presets) -> MethodCard:
    return MethodCard(name="m", version="1.0", citation="", fidelity="original", topology="p2p", summary="A method.",
                      presets=presets)


def test_a_card_with_presets_is_frozen_and_hashable():
    card = _card(paper={"optimizer": "adam", "epochs": 2})
    assert hash(card) == hash(_card(paper={"epochs": 2, "optimizer": "adam"}))
    assert card.as_dict()["presets"] == {"paper": {"optimizer": "adam", "epochs": 2}}
    with pytest.raises(TypeError):
        card.presets["paper"]["epochs"] = 3  # type: ignore[index]


def test_preset_names_are_identifiers_and_their_keys_params_fields():
    assert card_problems(_card(paper={"optimizer": "adam"}), "m") == []
    for bad in ("Paper", "2x", "the paper", ""):
        assert any("identifier" in p for p in card_problems(_card(**{bad: {"lam": 0.1}}), "m")), bad
    assert any("must map hyperparameter names" in p for p in card_problems(_card(paper={}), "m"))
    assert preset_params_problems(_card(paper={"optimizer": "adam", "epochs": 2}), _Params) == []
    (unknown,) = preset_params_problems(_card(paper={"lr": 1e-3}), _Params)
    assert "sets lr, no hyperparameter of m" in unknown and "known: epochs, lam, optimizer" in unknown
    (typed,) = preset_params_problems(_card(paper={"epochs": "two"}), _Params)
    assert "preset 'paper'" in typed and "epochs" in typed
    (default,) = preset_params_problems(_card(paper={"optimizer": "sgd", "lam": 0.1}), _Params)
    assert "sets optimizer to the default" in default


def test_every_registered_preset_is_valid():
    """Registering refuses a bad preset; every method that declares one is here with it."""
    for name in builtin_methods():
        cls = get_method_class(name)
        assert preset_params_problems(cls.card, cls.Params) == [], name
    assert {n for n in builtin_methods() if get_method_class(n).card.presets} == set(BUMPED)


def test_the_matching_preset_is_the_one_whose_every_value_the_run_holds():
    card = _card(paper={"optimizer": "adam", "epochs": 2}, short={"epochs": 2})
    assert matching_preset(card, _Params, {"optimizer": "adam", "epochs": 2, "lam": 0.1}) == "paper"
    assert matching_preset(card, _Params, {"optimizer": "adam", "epochs": 2}, given="short") == "short"
    assert matching_preset(card, _Params, {"epochs": 2}) == "short"
    assert matching_preset(card, _Params, {"optimizer": "adam"}) is None
    assert matching_preset(card, _Params, {}) is None


def _resolved(**values) -> RunConfig:
    return engine.load_task(RunConfig(task="digits", clients=4, rounds=2, seed=0, **QUICK, **values))[1]


def test_a_preset_fills_its_hyperparameters_and_an_explicit_set_wins():
    cfg = _resolved(method="fedsocket", preset="paper")
    assert cfg.preset == "paper"
    assert cfg.method_params == {"local_epochs": 2, "warmup_epochs": 10, "private_lr": 0.05}
    cfg = _resolved(method="fedsocket", preset="paper", method_params={"warmup_epochs": "3", "lambda_kd": "0.4"})
    assert cfg.method_params == {"local_epochs": 2, "warmup_epochs": 3, "private_lr": 0.05, "lambda_kd": 0.4}
    assert cfg.preset is None  # the paper's warm-up changed: no longer the paper preset
    cfg = _resolved(method="fedsocket", preset="paper", method_params={"lambda_kd": "0.4"})
    assert cfg.preset == "paper"  # every value of the preset still holds
    cfg = _resolved(method="fedcc", preset="paper", public_size=100, method_params={"optimizer": "run"})
    assert cfg.method_params == {"pseudo_in_budget": False} and cfg.preset is None
    assert _resolved(method="fedmd", public_size=100).preset is None


def test_a_preset_and_the_same_values_by_set_are_one_run():
    """One config hash, one recorded preset, whichever way the values were given."""
    for method, values in [("fedcc", {"optimizer": "adam", "pseudo_in_budget": "false"}),
                           ("fedsocket", {"local_epochs": "2", "warmup_epochs": "10", "private_lr": "5e-2"}),
                           ("fedmd", {"private_init_epochs": "2"})]:
        by_preset = _resolved(method=method, preset="paper", public_size=100)
        by_set = _resolved(method=method, method_params=values, public_size=100)
        default = _resolved(method=method, public_size=100)
        assert by_preset == by_set, method
        assert config_hash(dataclasses.asdict(by_preset)) == config_hash(dataclasses.asdict(by_set)), method
        assert config_hash(dataclasses.asdict(by_preset)) != config_hash(dataclasses.asdict(default)), method


def test_a_run_without_a_preset_keeps_the_hash_it_had():
    """``preset`` is hashed through the values it sets: a config without it hashes as before."""
    cfg = dataclasses.asdict(_resolved(method="crad"))
    assert cfg["preset"] is None
    assert config_hash(cfg) == config_hash({k: v for k, v in cfg.items() if k != "preset"})


def test_an_unknown_preset_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"method fedcc has no preset 'adam'; its presets: paper"):
        _resolved(method="fedcc", preset="adam", public_size=100)
    result, stdout, stderr = invoke_cli("run", "--method", "local", "--preset", "paper", "--clients", "4",
                                        "--rounds", "1", "--out", "unused-out")
    assert result.exit_code == 2
    text = (stderr or result.output).strip()
    assert text == "error: method local has no preset 'paper'; its presets: none (hfl-bench describe local shows them)"
    result, _, stderr = invoke_cli("run", "--method", "fedsocket", "--preset", "Paper", "--out", "unused-out")
    assert result.exit_code == 2 and "its presets: paper" in (stderr or result.output)
    assert len((stderr or result.output).strip().splitlines()) == 1


def test_describe_shows_the_presets():
    result, stdout, _ = invoke_cli("describe", "fedsocket")
    assert result.exit_code == 0
    assert "presets: paper: local_epochs=2, warmup_epochs=10, private_lr=0.05" in " ".join(stdout.split())
    result, stdout, _ = invoke_cli("describe", "local")
    assert "presets: none" in stdout


QUICK_ARGS = ("--task", "digits", "--clients", "4", "--rounds", "2", "--local-epochs", "1", "--batch-size", "64",
              "--lr", "0.01")


def _smoke_args(method: str) -> list[str]:
    smoke = smoke_config(method)
    args = ["--method", method, *QUICK_ARGS, "--public-size", str(smoke["public_size"]),
            "--pretrain-size", str(smoke.get("pretrain_size", 0))]
    if smoke["pool"]:
        args += ["--pool", smoke["pool"]]
    for key, value in smoke["method_params"].items():
        args += ["--set", f"{key}={value}"]
    return args


@pytest.mark.parametrize("method", BUMPED)
def test_a_bumped_method_runs_at_its_defaults_and_with_its_paper_preset(method, run_record, tmp_path):
    card = get_method_class(method).card
    default = run_record(*_smoke_args(method), out=tmp_path / "default")
    paper = run_record(*_smoke_args(method), "--preset", "paper", out=tmp_path / "paper")
    for record in (default, paper):
        assert record["status"] == "ok" and record["schema_version"] == "1.11"
        assert record["method"]["version"] == card.version != "1.0"
    assert default["method"]["preset"] is None and default["config"]["preset"] is None
    assert paper["method"]["preset"] == "paper" and paper["config"]["preset"] == "paper"
    for key, value in card.presets["paper"].items():
        assert paper["method"]["hparams"][key] == value
        assert paper["config"]["method_params"][key] == value
        assert default["method"]["hparams"][key] != value
    assert paper["config_hash"] != default["config_hash"]
