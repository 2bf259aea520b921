"""DepthFL (Kim, Yu, Kim and Moon, "DepthFL: Depthwise Federated Learning for Heterogeneous Clients",
ICLR 2023).

One global model of K blocks with an exit classifier after each; a client of depth d trains the
first d blocks and their d exits on the sum of the exits' cross-entropy plus mutual
self-distillation among its exits, the server averages each tensor over the clients that hold it,
and a client predicts with the mean of its exits' logits. The family's code is
``hfl_bench.families.depth``, the model ``hfl_bench.depth_models``; every choice:
``docs/reference/method-notes/depthfl.md``.
"""

from __future__ import annotations

from hfl_bench.families.depth import DepthParams, DepthRounds
from hfl_bench.method_api import Method, MethodCard, SmokeSettings, register_method


@register_method
class DepthFL(DepthRounds, Method):
    card = MethodCard(
        name="depthfl", version="1.0", fidelity="reconstructed", topology="server",
        citation="Kim, Yu, Kim, Moon, DepthFL: Depthwise Federated Learning for Heterogeneous Clients, ICLR 2023",
        summary="Each client trains the first blocks of one global model (an exit after each) with mutual "
                "self-distillation among its exits; the server averages each tensor over its holders.",
        submodels=True, pool="depthfl-cnn",
        why_single_modality="it slices one global image model, which has no encoder per modality",
        why_not_tokens="its global model is DepthFL's CNN, which reads images or signals",
        smoke=SmokeSettings(),
        notes=(
            "model: DepthFL's ResNet-18 split into 4 stages with an exit after each, at CPU scale (pool depthfl-cnn): "
            "4 blocks of conv 3x3 (no bias), BN with running statistics (DepthFL's code default) and ReLU, 16-128 "
            "channels, a 2x2 max-pool before blocks 2-4; exits 1-3: a depthwise-separable 3x3 conv of stride 2 to 128 "
            "channels, BN, ReLU (one of the paper's SepConv bottlenecks), global average pooling, linear; "
            "exit 4: global average pooling and linear. The paper's ResNet-18 and its attention modules are not built",
            "capacity levels: DepthFL's four client groups, lettered as the width family's levels (a the largest "
            "model), the reverse of the paper's letters (its a is the shallowest): a holds all K blocks, b K-1, c K-2, "
            "d K-3 (depths 4, 3, 2, 1; parameters on digits: 118,664, 43,390, 14,516, 3,914; forward FLOPs per "
            "sample: 593,792, 443,776, 276,224, 91,136); the profile syntax "
            "and the seeded draw are the width family's, so a profile and seed give each client the same level as "
            "in heterofl; levels fixed per client for the run",
            "local loss: the sum over the client's d exits of CE, plus for each exit k kd / (d - 1) times the sum over "
            "the other exits j of T^2 KL(softmax(z_j / T) || softmax(z_k / T)), the teacher detached (the paper's "
            "mutual self-distillation; DepthFL's code); kd = 1 and T = 1 by default: constant, where DepthFL's code "
            "ramps the weight up over its first 300 rounds (exp(-5 (1 - t/300)^2)), a ramp a CPU-scale run never "
            "leaves",
            "aggregation: each global tensor is the mean over the active clients whose sub-model holds it (uniform by "
            "default; weighting=samples weights by training size); a tensor no active client holds keeps its value; "
            "BN's running statistics are averaged as parameters, its batch counter is the first holder's (as fedavg)",
            "the server averages plainly: the paper's DepthFL row runs on FedDyn (its code's default: the dynamic "
            "regularizer and the server's correction), its DepthFL (FedAvg) row on plain averaging, without "
            "self-distillation (kd=0 here); FedDyn is not built here",
            "prediction: each client's model outputs the mean of its exits' logits (the paper's inference, the "
            "ensemble of the classifiers it holds); a one-exit model outputs that exit's logits",
            "the server's initial global model is client 0's initialization; every client receives the tensors it "
            "holds of the new global model at the end of each round and keeps its optimizer (momentum) across "
            "rounds, as fedavg does",
            "headline: each client's own sub-model (its exits' ensemble) on its local test half and on the global "
            "test set, as for every method; the paper reports the global model's exits' ensemble on the global "
            "test set",
        ),
    )
    Params = DepthParams
