"""FedSocket style (methods spec, Sec. 8) on a single-modality task: CLI end to end, ownership-aware
aggregation, Joint weights, reliability weights, cached features and what crosses the channel; the
family pieces (hfl_bench.families.shared_predictor) it shares with naive-shared. The multimodal
setting is in test_fedsocket_multimodal.py."""

from __future__ import annotations

import pytest
import torch

import hfl_bench.methods.fedsocket as fs  # noqa: F401  registers the method
from hfl_bench import engine
from hfl_bench.config import ConfigError, resolve
from hfl_bench.data import get_task
from hfl_bench.families import shared_predictor as sp
from hfl_bench.metering import payload_bytes
from hfl_bench.recording import build_record
from hfl_bench.training import state_bytes


def test_cli_run_writes_a_valid_record_with_three_endpoints(run_record):
    record = run_record("--method", "fedsocket", "--task", "digits", "--clients", "4", "--rounds", "2",
                        "--set", "warmup_epochs=1", "--set", "pretrain_steps=50", "--pretrain-size", "100")
    assert record["status"] == "ok" and record["method"]["name"] == "fedsocket"
    assert record["method"]["fidelity"] == "reconstructed"
    assert record["federation"]["topology"] == "server"
    assert record["method"]["hparams"]["endpoint"] == "private"
    assert record["method"]["hparams"]["warmup_epochs"] == 1
    assert any("extractor=pretrained" in n for n in record["method"]["notes"])
    assert record["method"]["run_details"]["feature_bank"]["extractor"] == "pretrained"
    assert record["partition"]["pretrain_size"] == 100
    acc = record["metrics"]["global_acc"]
    assert 0 <= acc <= 100
    extra = record["metrics"]["extra_endpoints"]
    assert set(extra) == {"private", "q", "joint"}
    for scores in extra.values():
        assert 0 <= scores["global_acc"] <= 100 and 0 <= scores["local_acc"] <= 100
    # The headline is Private: the same figure as the "private" endpoint.
    # Records round figures to 4 decimals (<= 5e-5 apart, one 1e-4 step where two roundings straddle);
    # one flipped test prediction moves a client mean by 100 / (359 x 4) ~ 0.07: abs=1e-3 tells them apart.
    assert extra["private"]["global_acc"] == pytest.approx(acc, abs=1e-3)
    assert all(h["bytes"] > 0 for h in record["history"][1:])


def test_head_row_of_a_class_nobody_holds_is_unchanged():
    old = {"head.weight": torch.arange(6.0).view(3, 2), "head.bias": torch.tensor([10.0, 20.0, 30.0]),
           "body.weight": torch.zeros(2)}
    a = {"head.weight": torch.full((3, 2), 100.0), "head.bias": torch.full((3,), 100.0),
         "body.weight": torch.tensor([1.0, 1.0])}
    b = {"head.weight": torch.full((3, 2), 200.0), "head.bias": torch.full((3,), 200.0),
         "body.weight": torch.tensor([4.0, 4.0])}
    counts = [[5, 3, 0],   # client a: 8 samples, classes 0 and 1
              [0, 2, 0]]   # client b: 2 samples, class 1 only; nobody holds class 2
    new = sp.aggregate_q(old, [a, b], [8, 2], counts, keep=0.5)
    assert torch.equal(new["head.weight"][2], old["head.weight"][2])
    assert new["head.bias"][2] == 30.0
    # class 0: only a holds it -> 0.5 old + 0.5 * 100
    assert torch.allclose(new["head.weight"][0], 0.5 * torch.tensor([0.0, 1.0]) + 50.0)
    assert new["head.bias"][0] == pytest.approx(0.5 * 10 + 50)
    # class 1: both hold it, sample-weighted 0.8 / 0.2 -> 120
    assert torch.allclose(new["head.weight"][1], 0.5 * torch.tensor([2.0, 3.0]) + 60.0)
    # other blocks: sample-weighted over all uploads (0.8 * 1 + 0.2 * 4 = 1.6), then stabilized
    assert torch.allclose(new["body.weight"], torch.tensor([0.8, 0.8]))


def test_joint_weights_follow_the_formula():
    # positive counts 10, 20, 40: median 20; rho 0.5 -> rho * med = 10
    omega = sp.joint_weights([0, 10, 20, 40], rho=0.5)
    assert omega.tolist() == pytest.approx([1.0, 10 / 20, 10 / 30, 10 / 50])
    # an even number of positive counts: the median is the mean of the middle two (5)
    omega = sp.joint_weights([2, 4, 0, 6, 8], rho=2.0)
    assert omega.tolist() == pytest.approx([10 / 12, 10 / 14, 1.0, 10 / 16, 10 / 18])
    assert sp.joint_weights([0, 0, 0], rho=1.0).tolist() == [1.0, 1.0, 1.0]


def test_joint_predictor_mixes_private_and_q_by_class():
    private, q = torch.nn.Linear(2, 3, bias=False), torch.nn.Linear(2, 3, bias=False)
    x = torch.tensor([[1.0, -2.0], [0.5, 0.3]])
    omega = torch.tensor([1.0, 0.25, 0.5])
    joint = sp.JointPredictor(private, q, omega)
    expected = (1 - omega) * torch.softmax(private(x), -1) + omega * torch.softmax(q(x), -1)
    # a float32 mixture of two softmaxes through log and back: a few x 6e-8 on probabilities <= 1
    assert torch.allclose(joint(x).exp(), expected, atol=1e-6)


def test_reliability_weight_hand_computed():
    t = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.7, 0.1, 0.1, 0.1], [0.25] * 4, [1.0, 0.0, 0.0, 0.0]])
    y = torch.tensor([0, 2, 1, 0])
    # H = -(0.7 ln 0.7 + 3 * 0.1 ln 0.1) = 0.940446; 1 - H / ln 4 = 0.321611
    w = fs.reliability_weights(t, y)
    # a 6-decimal literal (<= 5e-7) through float32 ops (<= ~1e-7): abs=1e-5 with margin
    assert w.tolist() == pytest.approx([0.321611, 0.25 * 0.321611, 0.0, 1.0], abs=1e-5)


def test_weighted_kd_scales_each_sample_by_its_weight():
    s, t = torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), torch.softmax(torch.randn(3, 4), -1)
    per = [fs.weighted_kd(s[i : i + 1], t[i : i + 1], torch.ones(1), 2.0) for i in range(3)]
    w = torch.tensor([0.0, 0.5, 1.0])
    assert float(fs.weighted_kd(s, t, w, 2.0)) == pytest.approx(float(sum(wi * p for wi, p in zip(w, per)) / 3))


@pytest.mark.parametrize("kind", sp.EXTRACTORS)
def test_extractor_is_seeded_and_fits_any_input_shape(kind):
    for shape in [(1, 8, 8), (1, 1, 40), (3, 32, 32)]:
        x = torch.randn(5, *shape)
        a, b = sp.build_extractor(kind, shape, 256, 7), sp.build_extractor(kind, shape, 256, 7)
        assert a(x).shape == (5, 256)
        assert torch.equal(a(x), b(x))
        assert not torch.allclose(a(x), sp.build_extractor(kind, shape, 256, 8)(x))
        assert not any(p.requires_grad for p in a.parameters())


def test_feature_bank_answers_slices_from_cache_and_computes_the_rest():
    extractor = sp.build_extractor("random-conv", (1, 8, 8), 16, 0)
    base = torch.randn(50, 1, 8, 8)
    bank = sp.FeatureBank(extractor, [base])
    hit = bank._lookup(base[10:20])
    # cached features against a recomputation on other rows: the same float32 extractor, one eval-mode
    # pass each way, rows independent; only a kernel chosen by batch size could reorder a reduction
    assert hit is not None and torch.allclose(hit, extractor(base[10:20]), atol=1e-6)
    assert bank._lookup(base[[3, 1, 2]]) is None  # a gathered copy is computed, never guessed
    assert bank._lookup(base[::2]) is None  # other strides too
    assert torch.allclose(bank(base[[3, 1, 2]]), extractor(base[[3, 1, 2]]), atol=1e-6)


def test_only_q_and_counts_cross_the_channel_and_joint_headline(tiny_cfg):
    task = get_task("digits")
    cfg = resolve(tiny_cfg(method="fedsocket", clients=4, clients_per_round=2, pretrain_size=100, method_params={
        "warmup_epochs": 0, "local_epochs": 1, "endpoint": "joint", "pretrain_steps": 50}), task.info.defaults)
    sim = engine.Simulation(cfg)
    fed, method = sim.fed, sim.method
    q_bytes = state_bytes(method.held[0])
    counts_bytes = 8 + 8 * fed.num_classes  # sample count + int64 class counts
    assert q_bytes == payload_bytes(sp.SharedPredictor(256, 256, 32, fed.num_classes).state_dict())
    assert fed.channel.total == q_bytes * fed.n_clients  # setup: the initial Q to every client
    seen: set[int] = set()
    for rnd in (1, 2):
        active = sim.active_clients(rnd)
        stale = [k for k in active if k not in seen and rnd > 1]
        total_before = fed.channel.total
        entry = sim.step(rnd)
        sent = fed.channel.sent
        for k in range(fed.n_clients):
            assert sent[k] == (q_bytes + counts_bytes if k in active else 0)
        assert fed.channel.server_sent == q_bytes * (len(active) + len(stale))
        assert fed.channel.total - total_before == entry["bytes"]
        seen.update(active)
    assert all(isinstance(m, sp.JointPredictor) for m in method.eval_models(fed))
    result = sim.result()
    record = build_record(cfg, result)
    assert record["metrics"]["extra_endpoints"]["joint"]["global_acc"] == pytest.approx(
        # 4-decimal rounding against a 0.07-point flip, as in test_cli_run_writes_a_valid_record_with_three_endpoints
        record["metrics"]["global_acc"], abs=1e-3)


def test_bad_settings_are_rejected():
    for bad in ({"extractor": "resnet18"}, {"endpoint": "q"}, {"rho_grid": "1,x"}, {"rho_grid": "0"},
                {"warmup_epochs": -1}, {"server_keep": 1.5}, {"q_teacher": "q"}, {"q_return": "no"},
                {"share_q": "yes"}, {"pretrain_steps": 0}):
        with pytest.raises(ConfigError):
            fs.FedSocket(fs.FedSocketParams(**bad)).check(None)
    fs.FedSocket().check(None)
    d = fs.FedSocketParams()  # the spec's defaults, with Private on the protocol's budget
    assert (d.lambda_kd, d.lambda_fus, d.lambda_rel, d.private_lr, d.q_lr) == (0.5, 0.25, 0.2, None, 3e-4)
    assert (d.local_epochs, d.warmup_epochs, d.server_keep, d.feature_dim) == (None, 0, 0.5, 256)
    paper = fs.FedSocket.card.presets["paper"]  # the paper's budget: its stage epochs, warm-up and private lr
    assert (paper["local_epochs"], paper["warmup_epochs"], paper["private_lr"]) == (2, 10, 5e-2)
    for bad in ({"local_epochs": 0}, {"private_lr": 0.0}):
        with pytest.raises(ConfigError):
            fs.FedSocket(fs.FedSocketParams(**bad)).check(None)


def test_single_modality_q_keeps_its_layout_and_the_family_is_shared():
    # On a single-modality task Q has one adapter and one embedding, as before the multimodal
    # setting (tests/test_method_pins.py pins its numerics); the method uses the family's pieces.
    keys = set(sp.SharedPredictor(8, 8, 2, 3).state_dict())
    assert {"adapter.0.weight", "embedding", "head.weight"} <= keys
    assert not any(sp.modality_of(k) for k in keys)
    assert fs.FedSocket.card.missing_modalities
    assert fs.aggregate_q is sp.aggregate_q and fs.joint_weights is sp.joint_weights


def test_modality_bank_computes_each_modality_on_its_finite_rows_only():
    layout = {"a": (slice(0, 4), (1, 2, 2)), "b": (slice(4, 10), (1, 1, 6))}
    extractors = {"a": sp.build_extractor("random-projection", (1, 2, 2), 3, 0),
                  "b": sp.build_extractor("random-projection", (1, 1, 6), 3, 1)}
    x = torch.randn(4, 1, 1, 10)
    x[1, ..., 4:] = float("nan")  # row 1 lacks b
    x[2, ..., :4] = float("nan")  # row 2 lacks a
    bank = sp.ModalityFeatureBank(extractors, layout, 3, [x])
    u = bank.cached(0)
    assert u.shape == (4, 2, 3)
    assert torch.isnan(u[1, 1]).all() and torch.isnan(u[2, 0]).all()
    assert torch.allclose(u[0, 0], extractors["a"](x[0:1, ..., :4].reshape(1, 1, 2, 2))[0])
    assert torch.allclose(u[3, 1], extractors["b"](x[3:4, ..., 4:].reshape(1, 1, 1, 6))[0])
    assert torch.equal(bank(x[1:3]).nan_to_num(7.0), u[1:3].nan_to_num(7.0))  # a slice: from the cache
    gathered = bank(x[[2, 1]])  # a copy: computed by the same rule
    assert torch.allclose(gathered.nan_to_num(7.0), u[[2, 1]].nan_to_num(7.0), atol=1e-6)
    # Q on rows with any subset: a row's z is the mean over what it has; none at all gives NaN
    q = sp.SharedPredictor(3, 4, 2, 5, ("a", "b"))
    out = q(u)
    assert torch.isfinite(out).all()
    none = torch.full((1, 2, 3), float("nan"))
    assert torch.isnan(q(none)).all()
    one = q(u[2:3])  # b only
    z = q.adapters["b"](u[2:3, 1]) + q.embeddings["b"]
    assert torch.allclose(one, q.head(q.expert(z) + torch.sigmoid(q.gate) * q.up(q.down(z))), atol=1e-6)
    both = q.embed(u[0:1])
    expected = ((q.adapters["a"](u[0:1, 0]) + q.embeddings["a"]) + (q.adapters["b"](u[0:1, 1]) + q.embeddings["b"])) / 2
    assert torch.allclose(both, expected, atol=1e-6)
