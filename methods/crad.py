"""CRAD and its in-framework baselines: decentralized peer knowledge distillation.

Each round every client distills from its peers' round r-1 snapshots on its own data with (1 -
lambda) CE + lambda T^2 KL(q-bar || softmax(z / T)); the three methods differ only in the
aggregation rule that forms q-bar (``hfl_bench.aggregation``): ``uniform-kd`` the plain mean,
``uncertainty-kd`` softmax(-entropy) weights, ``crad`` support and agreement filters with
Agresti-Coull precision weights. ``--set aggregator=NAME`` swaps in any rule (the paper's Table 4
weightings, the filter ablations).

Fidelity: paper (arXiv 2609.00446, Alg. 1); uncertainty-kd's weight form is reconstructed. The paper
notes and every choice: ``docs/reference/method-notes/crad.md`` (the methods' reference pages).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hfl_bench.aggregation import get_aggregator
from hfl_bench.families.peer_kd import peer_kd_round
from hfl_bench.method_api import ConfigError, Method, MethodCard, RoundView, derive_seed, param, register_method
from hfl_bench.registry import AGGREGATORS, RegistryError

# The largest Laplace draw below is 52 ln 2 / epsilon (|log1p(-2|u|)| for a float64 uniform u of 53
# bits); the noisy counts are float32, so a smaller epsilon makes them infinite.
DP_EPSILON_MIN = 52 * math.log(2) / float(torch.finfo(torch.float32).max)
CITATION = "Class-wise Reliability-Aware Distillation for Decentralized Heterogeneous FL, arXiv 2609.00446"
COMMON_NOTES = (
    "temperature T=2 (paper silent)",
    "optimizer: the run's SGD; lr, momentum, weight decay, batch size, grad-norm clip are the config's (the task's "
    "protocol defaults; paper silent)",
    "each shard's held-out part stratified per class and split evenly into val and test (paper silent)",
)



@dataclass
class PeerKDParams:
    lam: float = param(0.7, "Distillation weight lambda.")
    temperature: float = param(2.0, "Distillation temperature T.")
    aggregator: str = param("uniform", "Aggregation rule (hfl-bench list aggregators).")
    min_support: float = param(2.0, "CRAD rules: validation samples of a class a teacher needs.")
    dp_epsilon: float | None = param(None, "CRAD rules: Laplace noise of scale 1/epsilon on shared counts.")


def peer_kd_card(name: str, fidelity: str, summary: str, notes: tuple[str, ...] = ()) -> MethodCard:
    """The card of a peer-KD method: the family's citation, topology and notes, plus its own."""
    # missing modalities: reads inputs only through the clients' own models, which fuse the
    # modalities a row has
    return MethodCard(name=name, version="1.0", fidelity=fidelity, topology="p2p", citation=CITATION,
                      summary=summary, missing_modalities=True, notes=COMMON_NOTES + notes)


class PeerKD(Method):
    """Shared class of the peer-KD family; subclasses set the default aggregation rule and the card."""

    Params = PeerKDParams

    def check(self, fed: RoundView) -> None:
        try:
            AGGREGATORS.get(self.params.aggregator)
        except RegistryError as e:
            raise ConfigError(str(e)) from None
        if self.params.dp_epsilon is not None and self.params.dp_epsilon <= 0:
            raise ConfigError(f"dp_epsilon must be > 0, got {self.params.dp_epsilon}")
        if self.params.dp_epsilon is not None and self.params.dp_epsilon < DP_EPSILON_MIN:
            raise ConfigError(f"dp_epsilon must be >= {DP_EPSILON_MIN:.2g}, got {self.params.dp_epsilon}: noise of "
                              "scale 1/epsilon beyond that overflows the float32 counts (the run would diverge)")
        if not 0 <= self.params.lam <= 1:
            raise ConfigError(f"lam must be in [0, 1], got {self.params.lam}")

    def setup(self, fed: RoundView) -> None:
        p = self.params
        self.aggregate = get_aggregator(p.aggregator, min_support=p.min_support)
        counts = fed.val_counts
        if p.dp_epsilon is not None:
            # Counts are fixed across rounds, so the noisy release happens once.
            gen = torch.Generator().manual_seed(derive_seed(fed.cfg.seed, "dp-counts"))
            u = torch.rand(counts.shape, generator=gen, dtype=torch.float64) - 0.5
            laplace = -(1.0 / p.dp_epsilon) * torch.sign(u) * torch.log1p(-2 * u.abs())
            counts = (counts.cpu().double() + laplace).clamp_min(0).float().to(fed.device)
        self.shared_counts = counts

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        return peer_kd_round(fed, rnd, active, self.aggregate, lam=self.params.lam,
                             temperature=self.params.temperature, counts=self.shared_counts,
                             accs=fed.val_accs())


@dataclass
class UniformParams(PeerKDParams):
    aggregator: str = param("uniform", "Aggregation rule (hfl-bench list aggregators).")


@dataclass
class UncertaintyParams(PeerKDParams):
    aggregator: str = param("entropy", "Aggregation rule (hfl-bench list aggregators).")


@dataclass
class CRADParams(PeerKDParams):
    aggregator: str = param("crad", "Aggregation rule (hfl-bench list aggregators).")


@register_method
class UniformKD(PeerKD):
    card = peer_kd_card("uniform-kd", "paper",
                        "Peer KD with the uniform mean of the peer teachers (CRAD paper's Uniform KD).")
    Params = UniformParams


@register_method
class UncertaintyKD(PeerKD):
    card = peer_kd_card(
        "uncertainty-kd", "reconstructed",
        "Peer KD with per-sample softmax(-entropy) teacher weights (reconstructed form).",
        ("teacher weight w_j(x) = softmax_j(-H(q_j(x))), entropy at T (paper ambiguous)",))
    Params = UncertaintyParams


@register_method
class CRAD(PeerKD):
    card = peer_kd_card(
        "crad", "paper", "CRAD: class-wise support and agreement filters, then Agresti-Coull precision weights.", (
            "support filter threshold n >= 2 validation samples (paper: a hyperparameter)",
            "a class with no supported teacher falls back to the plain mean of all teachers (paper silent)",
            "a class whose surviving teachers all weigh 0 (Table 4 accuracy-only weights) takes their uniform mean "
            "(paper silent)",
            "median = mean of the two middle deviations for an even count",
        ))
    Params = CRADParams
