"""FedAvg (McMahan et al., AISTATS 2017): sample-weighted parameter averaging at a server.

Fidelity: paper. Averaging parameters needs every client on one architecture, so the card
declares ``single_architecture`` and the engine refuses a pool of several architectures.

The broadcast is metered to every client each round, as the paper's server sends it, but a
client's copy is written only when the client is next drawn: until then it would equal the
server's model, which is what is evaluated for every client. The same numbers, and a round that
does not touch (or, under ``--client-state``, bring back) the clients it does not draw.
"""

from __future__ import annotations

import copy

from torch import nn

from hfl_bench.families.shared_model import weighted_average
from hfl_bench.method_api import (
    SERVER,
    Method,
    MethodCard,
    Payload,
    RoundView,
    SmokeSettings,
    make_plan,
    register_method,
    train_students,
)


@register_method
class FedAvg(Method):
    card = MethodCard(
        name="fedavg", version="1.0", fidelity="paper", topology="server",
        citation="McMahan et al., Communication-Efficient Learning of Deep Networks from Decentralized Data, 2017",
        summary="Server averages the active clients' weights (by training size) and broadcasts to all.",
        single_architecture=True,  # the engine refuses a pool of several architectures
        why_single_modality=("it averages one architecture's parameters, and a recipient's model lacks the "
                             "encoder of the modality it misses"),
        smoke=SmokeSettings(pool="cpu-cnn"),
    )

    def setup(self, fed: RoundView) -> None:
        # The server's initial model (client 0's initialization) goes to every other client.
        first = fed.channel.send(SERVER, list(range(1, fed.n_clients)), fed.clients[0].model.state_dict(),
                                 Payload.PARAMS)
        for c in fed.clients[1:]:
            c.model.load_state_dict(first)
        self.server = copy.deepcopy(fed.clients[0].model)  # the model every client holds after a broadcast

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        broadcast = self.server.state_dict()
        for i in active:  # the last broadcast, written now into the clients that use it (module docstring)
            fed.clients[i].model.load_state_dict(broadcast)
        losses = train_students(fed, active, {i: make_plan(fed, i, rnd) for i in active})
        states = [fed.channel.send(i, SERVER, fed.clients[i].model.state_dict(), Payload.PARAMS) for i in active]
        avg = weighted_average(states, [float(fed.clients[i].n_train) for i in active])
        self.server.load_state_dict(fed.channel.send(SERVER, list(range(fed.n_clients)), avg, Payload.PARAMS))
        return {"train_loss": sum(losses) / len(losses)}

    def changed_clients(self, fed: RoundView, active: list[int]) -> list[int]:
        return list(range(fed.n_clients))

    def eval_models(self, fed: RoundView) -> list[nn.Module]:
        return [self.server] * fed.n_clients  # one module: the evaluator runs it once per kind of input
