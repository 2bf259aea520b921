"""The shared-small-model methods (fedkd, fedmrl) and learned guidance (fedl2g): FedKD's SVD
compression (rank, the full-rank edge case, conv kernels, the energy schedule), its losses on a
hand example, its aggregation and metered bytes; FedMRL's trained projector, its evaluation
endpoint and its sub_feature_dim refusal; FedL2G's meta-gradient against finite differences, the
server's per-class average, the quiz hold-out and the warm-up."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.config import ConfigError
from hfl_bench.families.shared_model import param_count, smallest_member
from hfl_bench.metering import SERVER, payload_bytes
from hfl_bench.methods.fedkd import (
    compress,
    compress_state,
    energy_rank,
    energy_share,
    mentee_params,
    mutual_losses,
    reconstruct,
    reconstruct_state,
)
from hfl_bench.methods.fedl2g import average_rows, meta_gradient, present_rows, warm_up_rounds
from hfl_bench.training import make_plan

from helpers import cpu_federation, invoke_cli, ready_method

# ----------------------------------------------------------------------------- shared model


def test_the_shared_model_is_the_pools_smallest_member(tiny_cfg):
    fed = cpu_federation(tiny_cfg())
    sizes = {m.name: param_count(m, fed.info) for m in fed.pool.members}
    assert smallest_member(fed.pool, fed.info).name == min(sizes, key=sizes.get) == "resnet_tiny"
    for name in ("fedkd", "fedmrl"):
        m = ready_method(name, cpu_federation(tiny_cfg()))
        copies = m.mentees if name == "fedkd" else m.shared
        assert all(_equal(copies[0].state_dict(), c.state_dict()) for c in copies)  # one seeded init
        assert len({id(c) for c in copies}) == fed.n_clients  # but each client its own copy
        assert m.hparams()["shared_arch_used"] == "resnet_tiny"


def _equal(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- FedKD: SVD


def test_energy_rank_is_the_smallest_rank_above_the_share():
    energies = torch.tensor([6.0, 3.0, 1.0])  # cumulative shares 0.6, 0.9, 1.0
    assert energy_rank(energies, 0.5) == 1
    assert energy_rank(energies, 0.6) == 2  # strictly more than the share, as HtFLlib
    assert energy_rank(energies, 0.95) == 3  # only the full rank: kept (HtFLlib: rank 0, zeros)
    assert energy_rank(energies, 1.0) == 3


def test_a_tensor_only_its_full_rank_holds_arrives_whole_not_as_zeros():
    # the spec's case: a default-initialised Linear(512 -> 10) weight at energy 0.95 (HtFLlib sends zeros)
    torch.manual_seed(0)
    w = nn.Linear(512, 10).weight.detach()
    assert energy_rank(torch.linalg.svdvals(w) ** 2, 0.95) == 10
    assert torch.equal(reconstruct(compress(w, 0.95)), w)


def test_a_low_rank_matrix_travels_as_smaller_factors():
    gen = torch.Generator().manual_seed(1)
    low = torch.randn(64, 2, generator=gen) @ torch.randn(2, 48, generator=gen)
    w = low + 1e-3 * torch.randn(64, 48, generator=gen)
    c = compress(w, 0.95)
    assert isinstance(c, dict) and c["s"].shape == (2,)
    assert payload_bytes(c) == 4 * (64 * 2 + 2 + 2 * 48) < payload_bytes(w)
    assert torch.allclose(reconstruct(c), low, atol=0.02)


def test_conv_kernels_factor_per_slice_with_one_rank():
    gen = torch.Generator().manual_seed(2)
    kernel = torch.randn(8, 4, 5, 1, generator=gen) @ torch.randn(8, 4, 1, 5, generator=gen)  # rank-1 slices
    c = compress(kernel, 0.95)
    assert c["u"].shape == (8, 4, 5, 1) and c["s"].shape == (8, 4, 1) and c["vh"].shape == (8, 4, 1, 5)
    assert torch.allclose(reconstruct(c), kernel, atol=1e-5)
    # vectors, a first axis of 1 and factors no smaller than the tensor: raw
    for raw in (torch.randn(7, generator=gen), torch.randn(1, 9, generator=gen), torch.randn(3, 3, generator=gen)):
        assert isinstance(compress(raw, 0.95), torch.Tensor)


def test_the_energy_share_runs_from_t_start_to_t_end_over_the_run():
    assert energy_share(1, 11, 0.95, 0.98) == 0.95
    assert energy_share(11, 11, 0.95, 0.98) == pytest.approx(0.98)
    assert energy_share(6, 11, 0.95, 0.98) == pytest.approx(0.965)
    assert energy_share(1, 1, 0.95, 0.98) == 0.95


# ----------------------------------------------------------------------------- FedKD: losses


def test_fedkd_losses_on_a_hand_example():
    r = torch.tensor([[1.0, 0.0], [0.0, 2.0]], requires_grad=True)
    r_g = torch.tensor([[0.5, 0.5], [1.0, -1.0]], requires_grad=True)
    z = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]], requires_grad=True)
    z_g = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]], requires_grad=True)
    y = torch.tensor([0, 1])
    w_h = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        w_h.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
    l_mentor, l_mentee, l_hidden = mutual_losses(r, z, r_g, z_g, w_h, y)

    def ce(logits, label):
        return -torch.log_softmax(logits, 0)[label]

    ce_t = (ce(z[0], 0) + ce(z[1], 1)) / 2
    ce_s = (ce(z_g[0], 0) + ce(z_g[1], 1)) / 2
    s = ce_t + ce_s
    p, p_g = torch.softmax(z, 1), torch.softmax(z_g, 1)
    kl_t = (p_g * (p_g / p).log()).sum() / 2  # KL(p_g || p), summed over classes, batch mean (no 1/C)
    kl_s = (p * (p / p_g).log()).sum() / 2
    mapped = torch.tensor([[0.5, 1.0], [1.0, -2.0]])  # W_h r_g
    mse = ((r - mapped) ** 2).mean()  # over B x d entries
    assert l_mentor.item() == pytest.approx((ce_t + kl_t / s + mse / s).item(), rel=1e-6)
    assert (l_mentee + l_hidden).item() == pytest.approx((ce_s + kl_s / s + mse / s).item(), rel=1e-6)
    # each model gets its own loss's gradient only: nothing of the mentor's loss reaches the mentee or W_h
    g_zg, g_rg, g_w = torch.autograd.grad(l_mentor, [z_g, r_g, w_h.weight], allow_unused=True, retain_graph=True)
    assert all(g is None or not g.any() for g in (g_zg, g_rg, g_w))
    g_z, g_r = torch.autograd.grad(l_mentee + l_hidden, [z, r], allow_unused=True, retain_graph=True)
    assert all(g is None or not g.any() for g in (g_z, g_r))
    # the scale S is a constant: the mentor's gradient on z is CE's plus KL's / S, S held fixed
    (g_z,) = torch.autograd.grad(l_mentor, [z])
    q_g = p_g.detach()
    expected = ((torch.softmax(z, 1) - F.one_hot(y, 3)) / 2 + (torch.softmax(z, 1) - q_g) / 2 / s.detach()).detach()
    assert torch.allclose(g_z, expected, atol=1e-6)


# ----------------------------------------------------------------------------- FedKD: a round


def test_fedkd_round_averages_reconstructed_uploads_and_meters_the_factors(tiny_cfg, monkeypatch):
    fed = cpu_federation(tiny_cfg())
    m = ready_method("fedkd", fed, t_start=0.5, t_end=0.5)  # a low share: the head's matrix compresses
    key = "backbone.stem.1.running_mean"
    init_stats = dict(m.mentees[1].named_buffers())[key].clone()
    sends = []
    send = fed.channel.send

    def spy(src, dsts, payload, kind):
        sends.append((src, dsts, copy.deepcopy(payload)))
        return send(src, dsts, payload, kind)

    monkeypatch.setattr(fed.channel, "send", spy)
    active = [0, 2, 3]
    m.run_round(fed, 1, active)
    uploads = [p for src, dst, p in sends if dst == SERVER]
    ((_, to, broadcast),) = [s for s in sends if s[0] == SERVER]
    assert [s for s, d, _ in sends if d == SERVER] == active and to == list(range(fed.n_clients))
    raw = payload_bytes(mentee_params(m.mentees[0]))
    for cid, upload in zip(active, uploads):
        assert any(isinstance(v, dict) for v in upload.values())  # factors travel, not the rebuilt tensor
        assert payload_bytes(upload) < raw
        assert int(fed.channel.sent[cid]) == payload_bytes(upload)
    # the broadcast is the compressed uniform mean of the reconstructed uploads
    rebuilt = [reconstruct_state(u) for u in uploads]
    mean = {k: sum(r[k].double() for r in rebuilt) / len(rebuilt) for k in rebuilt[0]}
    expected = reconstruct_state(compress_state({k: v.float() for k, v in mean.items()}, 0.5))
    got = reconstruct_state(broadcast)
    assert all(torch.allclose(got[k], expected[k], atol=1e-5) for k in got)
    for mentee in m.mentees:  # every client's mentee holds it; buffers (BatchNorm statistics) stay local
        assert all(torch.equal(q, got[k]) for k, q in mentee.named_parameters())
    stats = [dict(x.named_buffers())[key] for x in m.mentees]
    assert not torch.equal(stats[0], stats[2]) and torch.equal(stats[1], init_stats)  # client 1 did not train


# ----------------------------------------------------------------------------- FedMRL


def test_fedmrl_trains_and_keeps_its_projector_and_predicts_through_it(tiny_cfg):
    fed = cpu_federation(tiny_cfg())
    m = ready_method("fedmrl", fed)
    assert m.sub_dim == 32  # min(HtFLlib's 128, d = 128, resnet_tiny's native 32)
    before = [p.weight.detach().clone() for p in m.proj]
    m.run_round(fed, 1, [0, 1])
    assert not torch.equal(before[0], m.proj[0].weight) and not torch.equal(before[1], m.proj[1].weight)
    assert torch.equal(before[2], m.proj[2].weight)  # inactive: untouched
    trained = m.proj[0].weight.detach().clone()
    m.run_round(fed, 2, [2])
    assert torch.equal(m.proj[0].weight, trained)  # kept across rounds (HtFLlib never saves it)
    assert all(_equal(m.shared[0].state_dict(), g.state_dict()) for g in m.shared)  # the broadcast average
    x = torch.randn(5, *fed.info.input_shape)
    local, shared, proj = fed.clients[1].model, m.shared[1], m.proj[1]
    predictor = m.eval_models(fed)[1].eval()
    with torch.no_grad():
        u = proj(torch.cat([shared.forward_features(x), local.forward_features(x)], 1))
        assert torch.allclose(predictor(x), local.head(u))
    assert m.changed_clients(fed, [2]) == list(range(fed.n_clients))


def test_fedmrl_refuses_a_sub_feature_dim_above_the_feature_width_in_one_line(tmp_path):
    result, out, err = invoke_cli("run", "--method", "fedmrl", "--clients", "4", "--rounds", "1", "--set",
                                  "feature_dim=16", "--set", "sub_feature_dim=32", "--out", str(tmp_path))
    assert result.exit_code == 2
    text = (err or out).strip()
    assert "sub_feature_dim" in text and "d = 16" in text and "Traceback" not in result.output
    assert len(text.splitlines()) == 1


# ----------------------------------------------------------------------------- FedL2G


class Tiny(nn.Module):
    """A split model small enough for finite differences."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(3, 2), nn.Linear(2, 3)

    def forward_features(self, x):
        return torch.tanh(self.body(x))


@pytest.mark.parametrize("space", ["feat", "logit"])
def test_fedl2g_meta_gradient_matches_finite_differences(space):
    torch.manual_seed(0)
    model = Tiny().double()
    width = 2 if space == "feat" else 3
    guides = torch.randn(3, width, dtype=torch.float64)
    study = [(torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 1, 0, 1]))]
    quiz = [(torch.randn(4, 3, dtype=torch.float64), torch.tensor([2, 1, 0, 1]))]
    lr = 0.5
    before = copy.deepcopy(model.state_dict())
    grad = meta_gradient(model, guides, study, quiz, lr, space)
    assert _equal(before, model.state_dict()) and all(p.grad is None for p in model.parameters())

    def quiz_after_step(g):
        stepped = copy.deepcopy(model)
        x, y = study[0]
        f = stepped.forward_features(x)
        out = stepped.head(f)
        loss = F.cross_entropy(out, y) + F.mse_loss(f if space == "feat" else out, g[y])
        grads = torch.autograd.grad(loss, list(stepped.parameters()))
        with torch.no_grad():
            for p, d in zip(stepped.parameters(), grads):
                p -= lr * d
            return float(F.cross_entropy(stepped.head(stepped.forward_features(quiz[0][0])), quiz[0][1]))

    eps = 1e-6
    numeric = torch.zeros_like(guides)
    for c in range(3):
        for j in range(width):
            up, down = guides.clone(), guides.clone()
            up[c, j] += eps
            down[c, j] -= eps
            numeric[c, j] = (quiz_after_step(up) - quiz_after_step(down)) / (2 * eps)
    assert torch.allclose(grad, numeric, atol=1e-7)
    assert not grad[2].any() and grad[0].any()  # class 2 is not in the study batch
    assert sorted(present_rows(grad)) == [0, 1]


def test_fedl2g_server_averages_each_class_over_the_clients_that_sent_it():
    a = {0: torch.tensor([1.0, 2.0]), 1: torch.tensor([4.0, 0.0])}
    b = {1: torch.tensor([2.0, 2.0])}
    out = average_rows([a, b], torch.Size([3, 2]), torch.zeros(1))
    assert torch.equal(out, torch.tensor([[1.0, 2.0], [3.0, 1.0], [0.0, 0.0]]))


def test_the_quiz_set_is_held_out_of_training_and_fixed_for_the_run(tiny_cfg):
    fed = cpu_federation(tiny_cfg())
    shard = set(fed.clients[1].train_idx.tolist())
    quiz = [set(make_plan(fed, 1, rnd, 1, "quiz", hold_out=20, held=True).indices.tolist()) for rnd in (1, 2)]
    rest = set(make_plan(fed, 1, 1, 1, hold_out=20).indices.tolist())
    assert quiz[0] == quiz[1] and len(quiz[0]) == 20
    assert not quiz[0] & rest and quiz[0] | rest == shard
    # no hold-out: the plan is the one it always was
    assert torch.equal(make_plan(fed, 1, 1).indices, make_plan(fed, 1, 1, hold_out=0).indices)


def test_fedl2g_warm_up_meta_learns_the_guides_without_training(tiny_cfg):
    assert warm_up_rounds(0.025, 2000) == 50 and warm_up_rounds(0.025, 30) == 1 and warm_up_rounds(0.025, 10) == 0
    fed = cpu_federation(tiny_cfg())
    m = ready_method("fedl2g", fed, warm_up=0.5)  # 1 of the 2 rounds
    models = [copy.deepcopy(c.model.state_dict()) for c in fed.clients]
    guides = m.guides.weight.detach().clone()
    assert m.run_round(fed, 1, [0, 1, 2, 3]) == {}
    assert all(_equal(s, c.model.state_dict()) for s, c in zip(models, fed.clients))
    assert m.changed_clients(fed, [0, 1]) == []
    assert not torch.equal(guides, m.guides.weight)  # one server step
    assert "train_loss" in m.run_round(fed, 2, [0, 1])
    assert not _equal(models[0], fed.clients[0].model.state_dict()) and m.changed_clients(fed, [0, 1]) == [0, 1]


def test_fedl2g_refuses_an_unknown_space(tiny_cfg):
    with pytest.raises(ConfigError, match="space must be one of feat, logit"):
        ready_method("fedl2g", cpu_federation(tiny_cfg()), space="features")
