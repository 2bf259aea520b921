"""Missing modalities (hfl_bench.modalities): the paired task, the recipient draw, the masking
rule (a client never sees what it does not observe, in training or evaluation), the late-fusion
pool, and every built-in method either running on the task or refusing it with one clear line."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from hfl_bench import engine, modalities
from hfl_bench.config import ConfigError, RunConfig
from hfl_bench.data import get_task
from hfl_bench.pools import LateFusionNet
from hfl_bench.registry import METHODS
from hfl_bench.tasks.digits_mnist1d import pair_by_class
from hfl_bench.testing import QUICK, builtin_methods, tiny_federation

TASK = "digits-mnist1d"


@pytest.fixture(scope="module")
def data():
    return get_task(TASK).load()


def test_pairing_is_by_class_without_replacement_and_fixed():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 4, 50), rng.integers(0, 4, 400)
    partner = pair_by_class(a, b, 0)
    assert (b[partner] == a).all() and len(set(partner.tolist())) == len(a)
    assert (pair_by_class(a, b, 0) == partner).all()  # a fixed rule, not a draw per call
    assert not (pair_by_class(a, b, 1) == partner).all()  # each split has its own shuffle


def test_task_pairs_real_images_with_real_signals_of_the_same_class(data):
    info = get_task(TASK).info
    where = modalities.slices(info)
    assert [m.name for m in info.modalities] == ["image", "signal"]
    assert data.train_x.shape[1:] == (1, 1, 104) and len(data.train_x) == 1438 and len(data.test_x) == 359
    # the image part is the digits task's image, standardized: same order, same class
    digits = get_task("digits").load()
    img = data.train_x[:, 0, 0, where["image"]]
    ref = digits.train_x.reshape(len(digits.train_x), -1)
    corr = np.corrcoef(img[:, :].numpy().ravel(), ref.numpy().ravel())[0, 1]
    assert corr > 0.99 and torch.equal(data.train_y, digits.train_y)
    again = get_task(TASK).load()
    assert torch.equal(again.train_x, data.train_x) and again.fingerprint == data.fingerprint


def test_recipient_draw_is_seeded_and_sized():
    info = get_task(TASK).info

    def plan(seed, fraction=0.5, clients=10):
        cfg = RunConfig(task=TASK, seed=seed, clients=clients, recipient_fraction=fraction, missing_modality="signal")
        return modalities.plan_for(cfg, info)

    assert plan(0).recipients == plan(0).recipients and len(plan(0).recipients) == 5
    assert any(plan(s).recipients != plan(0).recipients for s in range(1, 5))
    assert plan(0, 0.0).recipients == [] and len(plan(0, 1.0).donors) == 0
    assert len(plan(0, 0.01).recipients) == 1  # at least one when the fraction is > 0
    p = plan(3)
    assert all(p.observed[c] == ("image",) for c in p.recipients)
    assert all(p.observed[c] == ("image", "signal") for c in p.donors)
    assert p.record()["hash"] == plan(3).record()["hash"] != plan(4).record()["hash"]


def test_recipients_rows_hold_nan_for_the_missing_modality_only():
    fed = tiny_federation(task=TASK, clients=6, pool="cpu-mm")
    where = modalities.slices(fed.info)
    assert fed.recipients and len(fed.recipients) == 3
    for c in fed.clients:
        rows = fed.data.train_x[torch.cat([c.train_idx, c.val_idx, c.test_idx])].reshape(-1, 104)
        assert torch.isfinite(rows[:, where["image"]]).all()
        signal_finite = torch.isfinite(rows[:, where["signal"]])
        assert (signal_finite.all() if c.cid not in fed.recipients else (~signal_finite).all())
        model = c.model
        assert isinstance(model, LateFusionNet) and model.modalities == c.modalities
        assert ("signal" in model.encoders) == (c.cid not in fed.recipients)
    assert torch.isfinite(fed.data.test_x).all()  # the global test set stays whole; evaluation masks it


def test_no_encoder_ever_reads_a_missing_value_and_results_stay_finite():
    """Every recipient row is poisoned with NaN for the missing modality; peer KD runs donors'
    models as teachers on those rows. No encoder may receive a NaN, and every figure is finite."""
    from hfl_bench.evaluation import Evaluator
    from hfl_bench.testing import ready_method

    fed = tiny_federation(task=TASK, clients=4, pool="cpu-mm")
    seen = []

    def guard(module, args):
        seen.append(module)
        assert torch.isfinite(args[0]).all(), "an encoder read a missing (NaN) value"

    for c in fed.clients:
        for enc in c.model.encoders.values():
            enc.register_forward_pre_hook(guard)
    method = ready_method("crad", fed)
    method.run_round(fed, 1, list(range(fed.n_clients)))
    ev = Evaluator(fed, fed.timer)
    metrics = ev(1, method.eval_models(fed), list(range(fed.n_clients)), last=True)
    assert seen and np.isfinite(metrics.global_acc).all() and np.isfinite(metrics.val_acc).all()
    # a recipient is tested on the global test set with its missing modality NaN; donors on the whole set
    r = fed.recipients[0]
    x = ev._global_inputs[ev._input_key[r]].reshape(len(fed.data.test_y), -1)
    where = modalities.slices(fed.info)
    assert torch.isnan(x[:, where["signal"]]).all() and torch.isfinite(x[:, where["image"]]).all()


def test_fusion_model_gives_nan_for_a_row_with_none_of_its_modalities():
    fed = tiny_federation(task=TASK, clients=4, pool="cpu-mm")
    recipient = fed.clients[fed.recipients[0]].model.eval()
    x = fed.data.test_x[:3].clone().reshape(3, -1)
    x[0, modalities.slices(fed.info)["image"]] = float("nan")
    out = recipient(x.reshape(3, 1, 1, -1))
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1:]).all()


def test_pools_and_settings_that_do_not_fit_are_one_clear_error():
    with pytest.raises(ConfigError, match="does not build models for a task with several modalities"):
        tiny_federation(task=TASK, pool="cpu")
    with pytest.raises(ConfigError, match="builds multimodal models"):
        tiny_federation(task="digits", pool="cpu-mm")
    with pytest.raises(ConfigError, match="applies to multimodal tasks only"):
        tiny_federation(task="digits", recipient_fraction=0.5)
    with pytest.raises(ConfigError, match="did you mean 'signal'"):
        tiny_federation(task=TASK, missing_modality="signals")
    with pytest.raises(ConfigError, match="--faults on a task with missing modalities"):
        tiny_federation(task=TASK, faults="byzantine:0.25")
    with pytest.raises(ConfigError, match="--public-size"):
        tiny_federation(task=TASK, public_size=50)


@pytest.mark.slow  # the CLI as a process
def test_bad_modality_flag_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hfl_bench.cli", "run", "--method", "local", "--task", TASK,
                           "--missing-modality", "audio", "--rounds", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "audio" in lines[0] and "image, signal" in lines[0]


@pytest.mark.slow  # every method through real training
@pytest.mark.parametrize("name", builtin_methods())
def test_every_method_runs_the_task_or_refuses_it_clearly(name, tmp_path):
    card = METHODS.get(name).card
    cfg = RunConfig(method=name, task=TASK, clients=4, rounds=1, seed=0, pool="cpu-mm", **QUICK)
    if not card.missing_modalities:
        able = ", ".join(m for m, c in METHODS.items() if c.card.missing_modalities)
        with pytest.raises(ConfigError) as refused:
            engine.make_method(cfg)
        assert str(refused.value) == (f"method {name} does not run task {TASK}, whose clients miss modalities: "
                                      f"{card.why_single_modality}. Methods that do: {able}")
        return
    task = get_task(TASK)
    from hfl_bench.config import resolve
    cfg.method_params = dict(card.smoke.method_params)
    cfg.pretrain_size = card.smoke.pretrain_size
    result = engine.run(resolve(cfg, task.info.defaults), checkpoint=tmp_path / "ckpt")
    assert result.status == "ok", result.error
    assert np.isfinite(result.best.global_acc).all()
    assert result.modalities["recipients"] and result.modalities["donors"]
    for who in ("recipients", "donors"):  # each group's per-round figure (schema 1.5), the selected round's too
        figure = result.history[result.best.round][who]["global_acc"]
        # a 4-decimal rounded figure (<= 5e-5 off) against a 0.07-point flip of one test prediction
        assert figure == pytest.approx(result.best.global_acc[result.modalities[who]].mean(), abs=1e-3)
    for figures in result.best.endpoints.values():
        assert math.isfinite(figures["global_acc"])
