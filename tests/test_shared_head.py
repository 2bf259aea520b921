"""The head-sharing family (hfl_bench.families.shared_head): LG-FedAvg, FedGH and FedGen. Each runs
through the CLI; after a round every client (active or not) holds the global head, which is the
sample-weighted average of the uploaded heads (LG-FedAvg) or the server's header trained on the
uploaded class means (FedGH); FedGen's generator is trained by the server, kept, and the clients
use the trained one (HtFLlib's bug would leave them the initial one); its noise is Gaussian."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.config import ConfigError
from hfl_bench.families.shared_head import class_prototypes
from hfl_bench.metering import SERVER
from hfl_bench.methods.fedgen import FeatureGenerator, LabelNoise, ensemble_logits, generated_feature_loss, label_prior
from hfl_bench.methods.fedgh import received_pairs, train_header
from hfl_bench.testing import tiny_federation
from hfl_bench.training import derive_seed

from helpers import invoke_cli, ready_method

ROUND_SCALARS = {"lg-fedavg": {"train_loss"}, "fedgh": {"train_loss", "server_loss"},
                 "fedgen": {"train_loss", "g_loss"}}


def _equal_states(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _spy_uploads(fed, monkeypatch) -> dict[int, dict]:
    """What each client sends to the server from now on (copied when sent)."""
    uploads: dict[int, dict] = {}
    send = fed.channel.send

    def spy(src, dsts, payload, kind):
        if dsts == SERVER and src != SERVER:
            uploads[src] = {k: v.detach().clone() for k, v in payload.items()}
        return send(src, dsts, payload, kind)

    monkeypatch.setattr(fed.channel, "send", spy)
    return uploads


# ----------------------------------------------------------------------------- all three


@pytest.mark.parametrize("method", sorted(ROUND_SCALARS))
def test_cli_two_rounds_write_a_valid_record(run_record, method):
    extra = ["--set", "g_steps=3"] if method == "fedgen" else []
    record = run_record("--method", method, "--task", "digits", "--clients", "4", "--rounds", "2", *extra)
    assert record["status"] == "ok" and record["method"]["name"] == method
    assert record["federation"]["topology"] == "server"
    assert all(ROUND_SCALARS[method] <= set(h) for h in record["history"][1:])


@pytest.mark.parametrize("method", sorted(ROUND_SCALARS))
def test_every_client_starts_with_client_0s_head_and_ends_each_round_with_the_global_head(method):
    fed = tiny_federation(clients=4)
    m = ready_method(method, fed, **({"g_steps": 2, "hidden_dim": 16} if method == "fedgen" else {}))
    assert all(_equal_states(c.model.head, m.global_head) for c in fed.clients)
    base_1 = copy.deepcopy(fed.clients[1].model.backbone)
    start = copy.deepcopy(m.global_head)
    m.run_round(fed, 1, [0, 2, 3])
    assert not _equal_states(m.global_head, start)
    assert all(_equal_states(c.model.head, m.global_head) for c in fed.clients)  # client 1 too
    assert _equal_states(fed.clients[1].model.backbone, base_1)  # the inactive client's base is its own
    assert m.changed_clients(fed, [0]) == [0, 1, 2, 3]


# ----------------------------------------------------------------------------- LG-FedAvg


def test_lg_fedavg_head_is_the_sample_weighted_average_of_the_active_heads(monkeypatch):
    fed = tiny_federation(clients=4)
    m = ready_method("lg-fedavg", fed)
    uploads = _spy_uploads(fed, monkeypatch)
    active = [0, 2, 3]
    m.run_round(fed, 1, active)
    assert sorted(uploads) == active
    assert not torch.equal(uploads[0]["weight"], uploads[2]["weight"])  # trained on different data
    n = torch.tensor([fed.clients[i].n_train for i in active], dtype=torch.float64)
    for key in ("weight", "bias"):
        expected = sum((n[j] / n.sum()) * uploads[i][key].double() for j, i in enumerate(active)).float()
        assert torch.allclose(m.global_head.state_dict()[key], expected, atol=1e-7)


# ----------------------------------------------------------------------------- FedGH


def test_fedgh_server_step_is_sgd_on_the_class_means_by_hand():
    head = nn.Linear(2, 2)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    feats = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    steps, loss = train_header(head, feats, torch.tensor([0, 1]), epochs=1, lr=0.5, batch_size=2, seed=0)
    # zero logits: p = (1/2, 1/2); dW = mean_i (p_i - onehot_i) x_i^T; W <- -0.5 dW; db = 0
    assert steps == 1 and loss == pytest.approx(float(torch.log(torch.tensor(2.0))))
    assert torch.allclose(head.weight, torch.tensor([[0.125, -0.25], [-0.125, 0.25]]))
    assert torch.equal(head.bias, torch.zeros(2))
    steps, _ = train_header(head, torch.randn(5, 2), torch.zeros(5, dtype=torch.long), epochs=2, lr=0.1,
                            batch_size=2, seed=0)
    assert steps == 6  # 3 batches an epoch, the last of one pair (HtFLlib keeps it)


def test_fedgh_pairs_read_the_classes_from_the_mask_even_when_counts_are_inflated():
    protos_a, protos_b = torch.randn(2, 3), torch.randn(1, 3)
    received = [{"prototypes": protos_a, "classes": torch.tensor([True, False, True])},
                {"prototypes": protos_b, "classes": torch.tensor([False, True, False]) * 10}]  # a byzantine mask
    feats, labels = received_pairs(received)
    assert labels.tolist() == [0, 2, 1] and torch.equal(feats, torch.cat([protos_a, protos_b]))
    with pytest.raises(ConfigError, match="2 class means arrived for 1 classes"):
        received_pairs([{"prototypes": protos_a, "classes": torch.tensor([True, False, False])}])


def test_fedgh_class_means_are_eval_mode_means_over_the_whole_shard():
    fed = tiny_federation(clients=3)
    ready_method("fedgh", fed)
    client = fed.clients[1]
    client.model.train()
    means, present = class_prototypes(fed, 1)
    assert client.model.training  # mode restored
    x, y = fed.data.train_x[client.train_idx], fed.data.train_y[client.train_idx]
    with torch.no_grad():
        f = client.model.eval().forward_features(x)
    for c in range(fed.num_classes):
        assert bool(present[c]) == bool((y == c).any())
        if present[c]:
            assert torch.allclose(means[c], f[y == c].mean(0), atol=1e-5)


def test_fedgh_global_head_is_the_server_header_trained_on_the_uploaded_means(monkeypatch):
    fed = tiny_federation(clients=4)
    m = ready_method("fedgh", fed, server_epochs=2)
    expected = copy.deepcopy(m.global_head)
    uploads = _spy_uploads(fed, monkeypatch)
    m.run_round(fed, 1, [1, 3])
    assert sorted(uploads) == [1, 3]
    for cid in (1, 3):  # what went up: the trained client's class means, its classes as a mask
        means, present = class_prototypes(fed, cid)
        assert torch.equal(uploads[cid]["classes"], present) and torch.allclose(uploads[cid]["prototypes"],
                                                                               means[present])
    feats, labels = received_pairs([uploads[1], uploads[3]])
    train_header(expected, feats, labels, epochs=2, lr=0.01, batch_size=fed.cfg.batch_size,
                 seed=derive_seed(fed.cfg.seed, "fedgh-server", 1))
    assert _equal_states(m.global_head, expected)


# ----------------------------------------------------------------------------- FedGen


def test_fedgen_generator_is_trained_kept_and_used_by_the_clients_next_round():
    fed = tiny_federation(clients=3)
    m = ready_method("fedgen", fed, g_steps=3, hidden_dim=16)
    initial = copy.deepcopy(m.generator)
    m.run_round(fed, 1, [0, 1, 2])
    assert _equal_states(m.client_generator, initial)  # round 1: the clients had the initial generator
    assert not _equal_states(m.generator, initial)  # the server trained it ...
    trained = copy.deepcopy(m.generator)
    m.run_round(fed, 2, [0, 2])
    assert _equal_states(m.client_generator, trained)  # ... and the clients use the trained one


def test_fedgen_noise_is_gaussian_and_labels_follow_the_prior():
    draws = LabelNoise(torch.tensor([0.0, 3.0, 1.0]), z_dim=8, seed=1, device=torch.device("cpu"))
    noise, y = draws.draw(20000)
    assert noise.shape == (20000, 8) and (noise < 0).float().mean() == pytest.approx(0.5, abs=0.02)
    assert noise.mean() == pytest.approx(0.0, abs=0.02) and noise.std() == pytest.approx(1.0, abs=0.02)
    assert not (y == 0).any() and (y == 1).float().mean() == pytest.approx(0.75, abs=0.02)


def test_fedgen_label_prior_sums_counts_and_ignores_negative_ones():
    prior = label_prior([torch.tensor([1.0, 2.0, -5.0]), torch.tensor([0.0, 1.0, 2.0])], 3)
    assert prior.tolist() == [1.0, 3.0, 2.0]
    assert label_prior([torch.zeros(3)], 3).tolist() == [1.0, 1.0, 1.0]


def test_fedgen_ensemble_is_the_weighted_sum_of_the_uploaded_heads():
    template = nn.Linear(2, 3)
    states = [{"weight": torch.eye(3, 2), "bias": torch.ones(3)},
              {"weight": -torch.eye(3, 2), "bias": torch.tensor([0.0, 2.0, 4.0])}]
    z = torch.tensor([[1.0, 2.0]])
    out = ensemble_logits(template, states, [0.25, 0.75], z)
    # 0.25 * ([1, 2, 0] + 1) + 0.75 * ([-1, -2, 0] + [0, 2, 4])
    assert torch.allclose(out, torch.tensor([[-0.25, 0.75, 3.25]]))


def test_fedgen_client_term_is_the_heads_ce_on_generated_features_and_trains_only_the_head():
    torch.manual_seed(0)
    generator, head = FeatureGenerator(4, 3, 8, 5), nn.Linear(5, 3)
    counts = torch.tensor([1.0, 1.0, 2.0])
    loss = generated_feature_loss(generator, head, LabelNoise(counts, 4, 7, torch.device("cpu")), 6)
    loss.backward()
    noise, y = LabelNoise(counts, 4, 7, torch.device("cpu")).draw(6)
    assert loss.item() == pytest.approx(F.cross_entropy(head(generator(noise, y)), y).item(), rel=1e-6)
    assert head.weight.grad is not None and all(p.grad is None for p in generator.parameters())


@pytest.mark.parametrize("method,setting,message", [
    ("fedgen", "lr_g=0", "fedgen: lr_g must be > 0, got 0.0"),
    ("fedgh", "server_epochs=-1", "fedgh: server_epochs must be >= 0, got -1"),
    ("lg-fedavg", "feature_dim=-3", "feature_dim must be >= 0 (0 = the pool's largest feature size), got -3"),
])
def test_bad_hyperparameters_are_refused_in_one_line(tmp_path, method, setting, message):
    result, stdout, stderr = invoke_cli("run", "--method", method, "--task", "digits", "--clients", "2",
                                        "--rounds", "1", "--set", setting, "--out", str(tmp_path))
    assert result.exit_code == 2
    text = (stdout + stderr).strip()
    assert message in text and len(text.splitlines()) == 1
