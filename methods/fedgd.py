"""FedGD: FedMD on a synthetic transfer set made by a coordinator's generator (after TARGET, Zhang et
al., ICCV 2023, and its data-free distillation lineage).

Each round the active clients upload snapshots; a coordinator trains a class-conditional generator
against the snapshot ensemble (BN-statistics matching + CE + an adversarial term), synthesizes a
class-balanced set, computes the consensus logits on it and broadcasts both; the clients digest and
revisit as in FedMD. No public data are read.

Fidelity: reconstructed (a student-free adversarial term, a class-conditional generator). The loss,
the reasons for every choice and what was observed on digits:
``docs/reference/method-notes/fedgd.md`` (the method's reference page).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from hfl_bench.families.fedmd_exchange import (
    ExchangeParams,
    check_exchange,
    consensus,
    digest_and_revisit,
    make_digest_optimizers,
)
from hfl_bench.families.peer_kd import frozen_snapshots
from hfl_bench.families.transfer import transfer_logits
from hfl_bench.method_api import (
    SERVER,
    ConfigError,
    Data,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    SmokeSettings,
    derive_seed,
    finite_mean,
    param,
    register_method,
    require_at_least,
    seeded_init,
)


@dataclass
class FedGDParams(ExchangeParams):
    synthetic_size: int = param(500, "Synthetic samples kept per round (balanced labels) as the transfer set.")
    g_steps: int = param(3, "Generator Adam steps per round (spec: 10; 3 keeps a CPU round cheap).")
    g_batch_size: int = param(64, "Generator batch size (training and synthesis).")
    lr_g: float = param(2e-3, "Generator Adam learning rate (betas 0.5, 0.999).")
    z_dim: int = param(256, "Dimension of the generator's noise z.")
    lambda_bn: float = param(10.0, "Weight of the BatchNorm-statistics matching term.")
    lambda_oh: float = param(0.5, "Weight of the class-conditional CE term on the ensemble.")
    lambda_adv: float = param(1.0, "Weight of the adversarial term (snapshot-ensemble disagreement).")
    output_range: float = param(3.0, "The generator's sigmoid output is mapped onto [-r, r] (standardized data).")


class Generator(nn.Module):
    """Class-conditional image generator (DENSE / TARGET layout) for inputs of shape (C, H, W)."""

    def __init__(self, z_dim: int, num_classes: int, input_shape: tuple[int, ...], output_range: float,
                 width: int = 64):
        super().__init__()
        channels, h, w = input_shape
        # A dimension divisible by 4 starts at a quarter and is upsampled twice; any other stays full size.
        self.factor = tuple(2 if s % 4 == 0 else 1 for s in (h, w))
        self.start = tuple(s // (f * f) for s, f in zip((h, w), self.factor))
        self.output_range = output_range
        hidden = 2 * width
        self.embed = nn.Embedding(num_classes, z_dim)
        self.project = nn.Linear(z_dim, hidden * self.start[0] * self.start[1])
        self.body = nn.Sequential(
            _bn(hidden),
            nn.Upsample(scale_factor=self.factor),
            nn.Conv2d(hidden, hidden, 3, padding=1, bias=False),
            _bn(hidden),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=self.factor),
            nn.Conv2d(hidden, width, 3, padding=1, bias=False),
            _bn(width),
            nn.LeakyReLU(0.2),
            nn.Conv2d(width, channels, 3, padding=1),
            nn.Sigmoid(),
        )

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.project(z * self.embed(y))
        out = self.body(h.view(len(z), -1, *self.start))
        return (2 * out - 1) * self.output_range  # [0, 1] -> [-r, r], the standardized data's span


def _bn(channels: int) -> nn.BatchNorm2d:
    # Batch statistics in train and eval mode alike: the generator only ever runs on batches.
    return nn.BatchNorm2d(channels, track_running_stats=False)


@contextmanager
def bn_matching(models: list[nn.Module]) -> Iterator["BNStats"]:
    """Forward hooks on every tracked BatchNorm layer of ``models``; removed on exit."""
    stats = BNStats(models)
    try:
        yield stats
    finally:
        stats.remove()


class BNStats:
    """Collects, per model, sum over its BN layers of ||mu(x) - running_mean||_2 + ||var(x) - running_var||_2
    for the inputs the layers saw in the last forward pass."""

    def __init__(self, models: list[nn.Module]):
        self.terms: list[list[torch.Tensor]] = [[] for _ in models]
        self.with_bn = [False] * len(models)
        self.handles = []
        for k, model in enumerate(models):
            for module in model.modules():
                if isinstance(module, _BatchNorm) and module.running_mean is not None:
                    self.with_bn[k] = True
                    self.handles.append(module.register_forward_hook(self._hook(k)))

    def _hook(self, k: int):
        def hook(module: _BatchNorm, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            x = inputs[0]
            dims = [0] + list(range(2, x.dim()))  # all but the channel dimension
            mean, var = x.mean(dim=dims), x.var(dim=dims, unbiased=False)
            self.terms[k].append(torch.norm(mean - module.running_mean, 2) + torch.norm(var - module.running_var, 2))
        return hook

    def loss(self) -> torch.Tensor:
        """Mean over the models with BN of their summed layer terms (0 if none has BN); resets."""
        per_model = [torch.stack(t).sum() for t, has in zip(self.terms, self.with_bn) if has and t]
        self.terms = [[] for _ in self.terms]
        return torch.stack(per_model).mean() if per_model else torch.zeros(())

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def adversarial_loss(ensemble: torch.Tensor, individual: torch.Tensor) -> torch.Tensor:
    """-mean_j mean_x KL(p_t || p_j) on the samples where snapshot j agrees with the ensemble's
    argmax (DENSE's mask). ``ensemble`` [B, C], ``individual`` [K, B, C]."""
    log_t = F.log_softmax(ensemble, dim=-1)
    log_j = F.log_softmax(individual, dim=-1)
    kl = (log_t.exp() * (log_t - log_j)).sum(-1)  # [K, B]
    agree = (individual.argmax(-1) == ensemble.argmax(-1)).float()
    return -(kl * agree).mean()


@dataclass
class GeneratorLoss:
    total: torch.Tensor
    bn: torch.Tensor
    oh: torch.Tensor
    adv: torch.Tensor


def generator_loss(generator: Generator, teachers: list[nn.Module], bn: BNStats, z: torch.Tensor,
                   y: torch.Tensor, p: FedGDParams) -> GeneratorLoss:
    """The spec's generator objective on one batch (teachers in eval mode, frozen)."""
    x = generator(z, y)
    individual = torch.stack([t(x) for t in teachers]).float()  # [K, B, C]
    ensemble = individual.mean(0)
    l_bn = bn.loss().to(x.device)
    l_oh = F.cross_entropy(ensemble, y)
    l_adv = adversarial_loss(ensemble, individual)
    total = p.lambda_bn * l_bn + p.lambda_oh * l_oh + p.lambda_adv * l_adv
    return GeneratorLoss(total, l_bn, l_oh, l_adv)


def draw_noise(n: int, z_dim: int, num_classes: int, seed: int, device: torch.device,
               labels: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded z ~ N(0, I) and labels (uniform draws unless given), drawn on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n, z_dim, generator=gen)
    y = torch.randint(num_classes, (n,), generator=gen) if labels is None else labels.cpu()
    return z.to(device), y.to(device)


def train_generator(fed: RoundView, generator: Generator, opt: torch.optim.Optimizer,
                    teachers: list[nn.Module], p: FedGDParams, rnd: int) -> dict[str, float]:
    """``g_steps`` Adam steps of the generator against the frozen ``teachers``; mean loss terms."""
    generator.train()
    totals = torch.zeros(4, device=fed.device)
    with bn_matching(teachers) as bn:
        for step in range(p.g_steps):
            seed = derive_seed(fed.cfg.seed, "fedgd-z", rnd, step)
            z, y = draw_noise(p.g_batch_size, p.z_dim, fed.num_classes, seed, fed.device)
            loss = generator_loss(generator, teachers, bn, z, y, p)
            opt.zero_grad(set_to_none=True)
            loss.total.backward()
            opt.step()
            totals += torch.stack([loss.total, loss.bn, loss.oh, loss.adv]).detach()
    fed.budget.add(SERVER, Data.SERVER, p.g_steps, p.g_steps * p.g_batch_size)  # the coordinator's steps
    means = {"g_loss": finite_mean(totals[0], p.g_steps, "generator")}
    means.update(zip(("g_bn", "g_oh", "g_adv"), (totals[1:] / max(p.g_steps, 1)).tolist()))
    return means


@torch.no_grad()
def synthesize(fed: RoundView, generator: Generator, p: FedGDParams, rnd: int) -> torch.Tensor:
    """``synthetic_size`` samples with balanced labels (arange mod classes), in generator batches."""
    labels = torch.arange(p.synthetic_size) % fed.num_classes
    z, y = draw_noise(p.synthetic_size, p.z_dim, fed.num_classes, derive_seed(fed.cfg.seed, "fedgd-synth", rnd),
                      fed.device, labels)
    b = p.g_batch_size
    return torch.cat([generator(z[i : i + b], y[i : i + b]) for i in range(0, len(z), b)])


@register_method
class FedGD(Method):
    card = MethodCard(
        name="fedgd", version="1.0", fidelity="reconstructed", topology="server",
        citation=("FedMD (Li & Wang, arXiv 1910.03581) on a synthetic transfer set generated as in TARGET "
                 "(Zhang et al., ICCV 2023, arXiv 2303.06937)"),
        summary="A coordinator's generator synthesizes a transfer set from the snapshots; then the FedMD exchange.",
        transfer="synthetic",
        why_single_modality="its generator synthesizes inputs of one modality",
        why_not_tokens="its generator synthesizes continuous inputs, which are no token ids",
        smoke=SmokeSettings(method_params={"g_steps": "2", "synthetic_size": "128"}),
        notes=(
            "reconstructed: FedMD exchange on a synthetic set (synthetic_size samples) from a coordinator's generator "
            "(TARGET-style)",
            "generator loss lambda_bn * BN-statistics matching (L2 norms of mean and variance gaps, mean over "
            "snapshots with BN; BN-free models add nothing) + lambda_oh * CE(ensemble, y) + lambda_adv * "
            "adversarial term",
            "adversarial term without a student: -KL(ensemble || snapshot), averaged over snapshots, masked to "
            "samples where the snapshot agrees with the ensemble's argmax (DENSE's mask)",
            "class-conditional generator (z times a learned class embedding) so a persistent generator can follow "
            "y ~ Uniform; balanced labels in the synthetic set",
            "generator: linear -> 128 x (H/4 x W/4) -> BN -> up -> conv 128 -> BN -> LReLU -> up -> conv 64 -> BN -> "
            "LReLU -> conv -> sigmoid; a size not divisible by 4 is not upsampled (mnist1d: 1x10 -> 1x40)",
            "sigmoid output mapped onto [-output_range, output_range] (standardized data; the normalization "
            "constants are not kept)",
            "generator and its Adam (lr_g, betas 0.5/0.999) persist across rounds; g_steps per round (spec: 10; "
            "fewer for CPU cost) at g_batch_size",
            "server-form exchange: the coordinator computes the consensus from the uploaded snapshots and "
            "broadcasts it with the synthetic set (float32) to the active clients; no logit upload",
            "digest: digest_loss on logits with a per-client Adam at digest_lr kept across rounds; revisit: private "
            "CE with the client's SGD",
            "no initialization phase before round 1 (no labeled public data); --public-size is held out, never read",
        ),
    )
    Params = FedGDParams

    def check(self, fed: RoundView) -> None:
        p = self.params
        check_exchange("fedgd", p)
        require_at_least("fedgd", p, ("synthetic_size", "g_batch_size", "z_dim"), 1)
        require_at_least("fedgd", p, ("g_steps", "lambda_bn", "lambda_oh", "lambda_adv"), 0)
        if p.lr_g <= 0 or p.output_range <= 0:
            raise ConfigError(f"fedgd: lr_g and output_range must be > 0, got {p.lr_g}, {p.output_range}")
        if len(fed.info.input_shape) != 3:
            raise ConfigError(f"fedgd: needs (channels, height, width) inputs, task {fed.info.name} has "
                              f"{fed.info.input_shape}")

    def setup(self, fed: RoundView) -> None:
        p = self.params
        with seeded_init(fed, "fedgd-generator"):
            self.generator = Generator(p.z_dim, fed.num_classes, fed.info.input_shape, p.output_range).to(fed.device)
        self.g_opt = torch.optim.Adam(self.generator.parameters(), lr=p.lr_g, betas=(0.5, 0.999))
        self.digest_opts = make_digest_optimizers(fed, p.digest_lr)

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        p = self.params
        with fed.timer(Phase.AGGREGATION):
            # the coordinator needs white-box snapshots: frozen copies of what it received
            received = {i: fed.channel.send(i, SERVER, fed.clients[i].model, Payload.MODEL) for i in active}
            snapshots = frozen_snapshots(fed, active, received)
        with fed.timer(Phase.GENERATOR):
            g_stats = train_generator(fed, self.generator, self.g_opt, list(snapshots.values()), p, rnd)
            x = synthesize(fed, self.generator, p, rnd)
        target = consensus(transfer_logits(fed, snapshots, x))
        with fed.timer(Phase.AGGREGATION):
            x = fed.channel.send(SERVER, active, x, Payload.GENERATOR)
            target = fed.channel.send(SERVER, active, target, Payload.LOGITS)
        out = digest_and_revisit(fed, rnd, active, x, target, self.digest_opts, p)
        out.update(g_stats)
        return out
