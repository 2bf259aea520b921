"""Local training only: every client trains on its own data and communicates nothing.

The floor every collaborative method must beat (methods spec, Sec. 9).
"""

from __future__ import annotations

from hfl_bench.method_api import Method, RoundView, make_plan, register_method, train_students


@register_method("local")
class Local(Method):
    """No communication: cross-entropy on each client's own data (the floor)."""

    fidelity = "paper"
    version = "1.0"
    topology = "none"
    # Reads inputs only through the clients' own models, which fuse the modalities a row has.
    missing_modalities = True
    citation = "Reference point; no paper."

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        losses = train_students(fed, active, {i: make_plan(fed, i, rnd) for i in active})
        return {"train_loss": sum(losses) / len(losses)}
