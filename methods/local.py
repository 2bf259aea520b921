"""Local training only: every client trains on its own data and communicates nothing.

The floor every collaborative method must beat (methods spec, Sec. 9). It has no paper and
nothing to reconstruct, so its card's fidelity is "paper".
"""

from __future__ import annotations

from hfl_bench.method_api import Method, MethodCard, RoundView, make_plan, register_method, train_students


@register_method
class Local(Method):
    card = MethodCard(
        name="local", version="1.0", fidelity="paper", topology="none", citation="Reference point; no paper.",
        summary="No communication: cross-entropy on each client's own data (the floor).",
        # Reads inputs only through the clients' own models, which fuse the modalities a row has.
        missing_modalities=True,
    )

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        losses = train_students(fed, active, {i: make_plan(fed, i, rnd) for i in active})
        return {"train_loss": sum(losses) / len(losses)}
