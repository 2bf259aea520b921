"""``example-median``: the per-sample, per-class median of the teachers, renormalized."""

import torch

from hfl_bench.aggregation import masked_median, register_aggregator


@register_aggregator("example-median")
def example_median(**_):  # a factory: hyperparameters arrive as keywords; ignore the ones it has no use for
    """Per-sample median of the teachers' probabilities (the middle pair's mean for an even count), renormalized."""

    def aggregate(probs: torch.Tensor, counts=None, accs=None) -> torch.Tensor:
        median = masked_median(probs, torch.ones_like(probs, dtype=torch.bool))  # [K, B, C] -> [B, C]
        return median / median.sum(dim=-1, keepdim=True).clamp_min(1e-12)

    return aggregate
