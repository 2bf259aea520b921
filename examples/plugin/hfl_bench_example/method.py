"""``example-kd``: decentralized peer KD (hfl-bench's peer-KD backbone), teachers combined by a
registered aggregation rule, ``example-median`` by default. First published here: "original"."""

from dataclasses import dataclass

from hfl_bench.aggregation import AGGREGATORS, get_aggregator
from hfl_bench.families.peer_kd import peer_kd_round
from hfl_bench.method_api import ConfigError, Method, MethodCard, RoundView, param, register_method


@dataclass
class ExampleKDParams:
    lam: float = param(0.5, "Distillation weight lambda in [0, 1].")
    temperature: float = param(2.0, "Distillation temperature T.")
    aggregator: str = param("example-median", "Aggregation rule (hfl-bench list aggregators).")


@register_method
class ExampleKD(Method):
    card = MethodCard(name="example-kd", version="1.0", fidelity="original", topology="p2p",
                      citation="hfl-bench-example-plugin (examples/plugin in the hfl-bench repository)",
                      summary="Example plugin: peer KD from the renormalized per-sample median of the peers.",
                      notes=("teachers combined per sample and class by their median, renormalized",))
    Params = ExampleKDParams

    def check(self, fed: RoundView) -> None:
        if not 0 <= self.params.lam <= 1:
            raise ConfigError(f"example-kd: lam must be in [0, 1], got {self.params.lam}")
        if self.params.aggregator not in AGGREGATORS:
            raise ConfigError(AGGREGATORS.unknown_message(self.params.aggregator))

    def setup(self, fed: RoundView) -> None:
        self.aggregate = get_aggregator(self.params.aggregator)

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        return peer_kd_round(fed, rnd, active, self.aggregate, lam=self.params.lam,
                             temperature=self.params.temperature, counts=fed.val_counts, accs=fed.val_accs())
