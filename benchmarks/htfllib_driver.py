"""Runs one of HtFLlib's algorithms on a PFLlib-layout MNIST folder with its FedAvgCNN, timed and
measured round by round. Our driver around HtFLlib's own code (none of its code is copied here).

Run with the working directory at an HtFLlib ``system/`` folder (HtFLlib reads its data from
``../dataset/<-data>``), e.g. by ``benchmarks/bench_htfllib.py --htfllib`` or
``benchmarks/htfllib_side_by_side.py``::

    python htfllib_driver.py -algo FML -data mnist -lbs 64 -ls 1 -lr 0.01 -nc 20 -gr 3 [--gate]

What it does, and why:

- HtFLlib's ``main.py`` builds its options in its ``__main__`` block and knows no model family for
  one-channel 28x28 images. The driver reads ``main.py``'s own ``parser.add_argument`` calls (so
  every option and default is HtFLlib's), parses the command line with them, sets
  ``args.models`` to HtFLlib's ``FedAvgCNN(in_features=1, num_classes, dim=1024)`` (its MNIST
  default; ``--in-features 3 --dim 1600`` for 3x32x32 images, its CIFAR-10 one) and builds the
  algorithm's server class as ``main.py`` does.
- It times each round of the server's own ``train`` loop without changing it: every HtFLlib
  server starts a round by calling ``select_clients`` and evaluates through ``test_metrics``; the
  driver wraps both on the server object. A round ``i`` here is one pass of that loop: evaluation
  of the models after ``i`` rounds of training (round 0: the untrained models), then round
  ``i + 1``'s training and aggregation (the loop's order).
- With ``--gate`` each round waits for a line on stdin before it starts, so a parent can
  interleave HtFLlib's rounds with its own (load drift hits both); the wait is not timed.
- ``--loader shuffled`` (a diagnostic, never the study's default) replaces HtFLlib's training
  loader (``Client.load_train_data``: fixed order, last partial batch dropped) by one that
  shuffles every epoch and keeps the last partial batch, as hfl-bench's training does, so a
  difference between the two sides can be put to the loader or not. ``as-is`` (default) changes
  nothing.
- ``--tgp-protos after-training`` (a diagnostic too) makes HtFLlib's FedTGP clients upload the
  prototypes of the model they have just trained, as the paper and hfl-bench's ``fedtgp`` do:
  ``clientTGP.train`` calls ``collect_protos`` before it saves the trained model, and
  ``collect_protos`` reads the model back from disk, so HtFLlib's uploads are of the model saved
  at the start of the round (one round behind; in round 1 the untrained models'). The driver runs
  ``train`` with ``collect_protos`` held back and calls it once the trained model is saved.
- ``--seed`` seeds python, numpy and torch before the server is built. HtFLlib's clients reseed
  torch with 0 when they are built (``torch.manual_seed(0)`` in every client constructor), so every
  seed would start from the same initial models and a method without other randomness would repeat
  one run; the driver gives that call the run's seed instead (clients still share one initial
  model, as in HtFLlib; ``--seed 0`` is HtFLlib's run unchanged).

Each round prints one line ``HTFL_ROUND {json}`` with the seconds of the round, of its evaluation
and of the rest (training and aggregation), the process's CPU seconds, the sample-weighted test accuracy (HtFLlib's
``Averaged Test Accuracy``) and the per-client correct counts and test sizes.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import random
import sys
import time
from pathlib import Path

MARK = "HTFL_ROUND"
# main.py's dispatch: algorithm name -> (server module, class)
SERVERS = {
    "Local": ("serverlocal", "Local"), "FedProto": ("serverproto", "FedProto"), "FedGen": ("servergen", "FedGen"),
    "FD": ("serverfd", "FD"), "LG-FedAvg": ("serverlg", "LG_FedAvg"), "FML": ("serverfml", "FML"),
    "FedKD": ("serverkd", "FedKD"), "FedGH": ("servergh", "FedGH"), "FedTGP": ("servertgp", "FedTGP"),
    "FedMRL": ("servermrl", "FedMRL"),
}
# HtFLlib's FedAvgCNN as its main.py builds it: MNIST (1 channel, flattened 1024); CIFAR-10 (3, 1600)
MODEL = "FedAvgCNN(in_features={in_features}, num_classes=args.num_classes, dim={dim})"


def htfllib_parser(main_py: Path) -> argparse.ArgumentParser:
    """An ArgumentParser with every ``parser.add_argument(...)`` call of HtFLlib's main.py."""
    parser = argparse.ArgumentParser(add_help=False)
    tree = ast.parse(main_py.read_text())
    for node in ast.walk(tree):
        call = node.value if isinstance(node, ast.Expr) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"
                and isinstance(call.func.value, ast.Name) and call.func.value.id == "parser"):
            exec(compile(ast.Expression(call), str(main_py), "eval"), {"parser": parser, "bool": bool,
                                                                       "int": int, "float": float, "str": str})
    return parser


def emit(record: dict) -> None:
    print(f"{MARK} {json.dumps(record)}", flush=True)


def instrument(server, gate: bool) -> None:
    """Wrap the server's ``select_clients`` (a round's start) and ``test_metrics`` (its evaluation)."""
    state = {"round": -1, "t0": None, "cpu0": None, "eval_s": 0.0, "stats": None}
    select, test_metrics = server.select_clients, server.test_metrics

    def close_round() -> None:
        if state["t0"] is None:
            return
        seconds = time.perf_counter() - state["t0"]
        rec = {"round": state["round"], "seconds": round(seconds, 4), "evaluation_s": round(state["eval_s"], 4),
               "training_s": round(seconds - state["eval_s"], 4),
               "cpu_s": round(time.process_time() - state["cpu0"], 4)}
        if state["stats"] is not None:
            ids, sizes, correct = state["stats"][:3]
            rec.update(acc=sum(correct) / max(sum(sizes), 1), ids=list(ids), test_sizes=[int(n) for n in sizes],
                       correct=[int(c) for c in correct])
        emit(rec)

    def timed_select():
        close_round()
        if gate and not sys.stdin.readline():
            sys.exit(0)  # the parent closed our stdin: stop between rounds
        state.update(round=state["round"] + 1, eval_s=0.0, stats=None, t0=time.perf_counter(),
                     cpu0=time.process_time())
        return select()

    def timed_test_metrics():
        t = time.perf_counter()
        stats = test_metrics()
        state["eval_s"] += time.perf_counter() - t
        state["stats"] = stats
        return stats

    server.select_clients, server.test_metrics = timed_select, timed_test_metrics
    server._driver_close_round = close_round


def shuffle_training_loader() -> None:
    """HtFLlib's clients read their training data through ``Client.load_train_data`` (every
    algorithm's client inherits it): the same DataLoader, shuffled each epoch (torch's global
    generator, seeded above) and keeping the last partial batch."""
    from flcore.clients import clientbase
    from torch.utils.data import DataLoader

    own = clientbase.Client.load_train_data

    def shuffled(self, batch_size=None):
        fixed = own(self, batch_size)
        return DataLoader(fixed.dataset, fixed.batch_size, drop_last=False, shuffle=True)

    clientbase.Client.load_train_data = shuffled


def tgp_protos_after_training() -> None:
    """FedTGP's clients collect their prototypes from the model they save at the end of ``train``."""
    from flcore.clients.clienttgp import clientTGP

    train, collect = clientTGP.train, clientTGP.collect_protos

    def train_then_collect(self):
        self.collect_protos = lambda: None  # held back: train would read the start-of-round model
        try:
            train(self)
        finally:
            del self.collect_protos
        collect(self)  # reads the model train has just saved

    clientTGP.train = train_then_collect


def main() -> None:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--gate", action="store_true")
    own.add_argument("--seed", type=int, default=0)
    own.add_argument("--threads", type=int, default=1)
    own.add_argument("--in-features", type=int, default=1, help="image channels: 1 (MNIST) or 3 (CIFAR-10)")
    own.add_argument("--dim", type=int, default=1024, help="FedAvgCNN's flattened size: 1024 (28x28), 1600 (32x32)")
    own.add_argument("--loader", choices=("as-is", "shuffled"), default="as-is")
    own.add_argument("--tgp-protos", choices=("as-is", "after-training"), default="as-is")
    mine, rest = own.parse_known_args()
    # HtFLlib keeps every model as a whole pickled module that it writes and reads back in its own
    # temporary folder each round; torch >= 2.6 loads weights only by default, which refuses them.
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    system = Path.cwd()
    sys.path.insert(0, str(system))
    args = htfllib_parser(system / "main.py").parse_args(rest)
    import numpy as np
    import torch

    torch.set_num_threads(mine.threads)
    args.models = [MODEL.format(in_features=mine.in_features, dim=mine.dim)]
    if args.device == "cuda" and not torch.cuda.is_available():
        args.device = "cpu"
    random.seed(mine.seed)
    np.random.seed(mine.seed)
    torch.manual_seed(mine.seed)
    # Every HtFLlib client constructor calls torch.manual_seed(0) (its only seeding): all clients,
    # and every run whatever its seed, start from the same initial model, and a method with no other
    # randomness (its loaders do not shuffle) repeats the same run. The run's seed takes that 0's
    # place: clients still share one initial model, as in HtFLlib; seed 0 is HtFLlib's run unchanged.
    reseed = torch.manual_seed
    torch.manual_seed = lambda s: reseed(mine.seed if s == 0 else s)
    if mine.loader == "shuffled":
        shuffle_training_loader()
    if mine.tgp_protos == "after-training":
        tgp_protos_after_training()
    module, cls = SERVERS[args.algorithm]
    server_cls = getattr(importlib.import_module(f"flcore.servers.{module}"), cls)
    t = time.perf_counter()
    server = server_cls(args, 0)
    emit({"setup_s": round(time.perf_counter() - t, 2), "algorithm": args.algorithm,
          "args": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, list))}})
    instrument(server, mine.gate)
    server.train()
    server._driver_close_round()


if __name__ == "__main__":
    main()
