"""Runs the HeteroFL or FedRolex authors' code for ``benchmarks/sidebyside_submodel.py``.

Started by that script as ``python sidebyside_submodel_driver.py JOB`` with the working directory
set to a temporary export of the authors' code (their ``config.py`` reads ``config.yml`` from
there). Nothing of theirs is copied into this repository: this file imports their modules from
that folder. ``JOB`` is a torch file the script wrote (the clients' data as hfl-bench built it,
each client's width rate, the initial global model, the settings); the driver writes its result
beside it (``JOB`` with ``.out``): the global model's state after each round, or, for ``check``,
what their slicing and aggregation functions compute on given tensors.

Their code runs as it is, under their own ``cfg``; what the driver does in their place is listed
in ``benchmarks/sidebyside_submodel.py`` (PATCHES) and in docs/studies/submodel-sidebyside.md.
"""

from __future__ import annotations

import copy
import os
import sys
import time

import torch


class Samples(torch.utils.data.Dataset):
    """The clients' images as their datasets yield them: a dict with ``img`` and ``label``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y
        self.target = y.tolist()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return {"img": self.x[i], "label": self.y[i]}


def configure(cfg, process_control, job) -> None:
    """Their ``cfg`` for this job: their ``process_control`` on the control string, then the
    side-by-side's settings over the values it sets for MNIST."""
    s = job["settings"]
    n = len(job["rates"])
    cfg["data_name"], cfg["subset"], cfg["model_name"] = "MNIST", "label", "conv"
    # fed, users, frac, split mode, model split mode, profile, norm, scale, mask
    cfg["control"] = dict(zip(["fed", "num_users", "frac", "data_split_mode", "model_split_mode", "model_mode",
                               "norm", "scale", "mask"],
                              ["1", str(n), "1", "iid", "fix", s["profile"], "bn", "1", "0"]))
    process_control()
    cfg["model_rate"] = list(job["rates"])  # who holds which level: hfl-bench's seeded draw
    cfg["conv"] = {"hidden_size": list(s["hidden"])}
    cfg["data_shape"] = list(job["train_x"].shape[1:])
    cfg["classes_size"] = 10
    cfg["batch_size"] = {"train": s["batch"], "test": 100}
    cfg["lr"], cfg["momentum"], cfg["weight_decay"] = s["lr"], s["momentum"], s["weight_decay"]
    cfg["optimizer_name"] = "SGD"
    cfg["num_epochs"] = {"global": s["rounds"], "local": s["local_epochs"]}
    cfg["milestones"] = [s["rounds"] + 1]  # no decay within the run, as hfl-bench's constant lr
    cfg["device"] = "cpu"
    cfg["num_workers"] = 0
    cfg["world_size"] = 1
    cfg["log_interval"] = 1
    cfg["model_tag"] = "sidebyside"


def load_initial(model, tensors: list[torch.Tensor]) -> None:
    """hfl-bench's initial global model into theirs: the same layers in the same order."""
    state = model.state_dict()
    keys = [k for k, v in state.items() if v.is_floating_point()]
    assert len(keys) == len(tensors), (keys, len(tensors))
    for k, t in zip(keys, tensors):
        assert state[k].shape == t.shape, (k, state[k].shape, t.shape)
        state[k] = t.clone()
    model.load_state_dict(state)


def snapshot(state) -> list[torch.Tensor]:
    return [v.detach().clone().float() for v in state.values() if v.is_floating_point()]


def data_split_of(job) -> dict:
    return {"train": {i: list(map(int, ix)) for i, ix in enumerate(job["client_idx"])},
            "test": {i: [] for i in range(len(job["rates"]))}}


def label_split_of(job) -> dict:
    # every client holds every class for their combine: hfl-bench averages the classifier's rows
    # over every holder of the row (their label-split masking is not part of the side by side)
    return {i: list(range(10)) for i in range(len(job["rates"]))}


def run_heterofl(job) -> dict:
    sys.argv = [sys.argv[0]]  # their module parses the command line when imported: their defaults
    import models
    import train_classifier_fed as tcf
    from config import cfg
    from fed import Federation
    from logger import Logger
    from utils import make_optimizer, process_control

    configure(cfg, process_control, job)
    torch.manual_seed(job["settings"]["seed"])
    dataset = {"train": Samples(job["train_x"], job["train_y"])}
    data_split, label_split = data_split_of(job), label_split_of(job)
    model = models.conv(model_rate=cfg["global_model_rate"])
    load_initial(model, job["init"])
    optimizer = make_optimizer(model, cfg["lr"])
    logger = Logger(os.path.join("output", "runs", "sidebyside"))
    federation = Federation(model.state_dict(), cfg["model_rate"], label_split)
    states, seconds = [snapshot(federation.global_parameters)], []
    for epoch in range(1, cfg["num_epochs"]["global"] + 1):
        t0 = time.perf_counter()
        tcf.train(dataset["train"], data_split["train"], label_split, federation, model, optimizer, logger, epoch)
        seconds.append(time.perf_counter() - t0)
        states.append(snapshot(federation.global_parameters))
        logger.reset()
    return {"states": states, "seconds": seconds}


def stub_missing(*names: str) -> None:
    """Packages their dataset modules import at load time (anytree) and this side by side never
    uses (the data comes from hfl-bench): an empty module when not installed."""
    import importlib.util
    import types

    for name in names:
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = types.ModuleType(name)


def install_ray_shim() -> None:
    """Their FedRolex runs clients as Ray actors on GPUs; here one process runs them in turn."""
    import types

    ray = types.ModuleType("ray")
    ray.put = lambda x: x
    ray.get = lambda x: x
    ray.kill = lambda x: None
    ray.init = lambda *a, **k: None

    class Handle:
        def __init__(self, obj):
            self._obj = obj

        def __getattr__(self, name):
            method = getattr(self._obj, name)
            return types.SimpleNamespace(remote=method)

    def remote(*args, **kwargs):
        def wrap(cls):
            return types.SimpleNamespace(remote=lambda *a, **k: Handle(cls(*a, **k)))
        if len(args) == 1 and isinstance(args[0], type) and not kwargs:
            return wrap(args[0])
        return wrap

    ray.remote = remote
    sys.modules["ray"] = ray


def run_fedrolex(job) -> dict:
    install_ray_shim()
    sys.argv = [sys.argv[0]]
    from config import cfg
    from models import conv
    from resnet_client import ResnetClient
    from resnet_server import ResnetServerRoll
    from utils import make_optimizer, process_control

    configure(cfg, process_control, job)
    cfg["overlap"], cfg["weighting"] = None, "avg"  # main_resnet.py's defaults (--overlap, --weighting)
    # as main_resnet.py sets it when imported
    cfg["metric_name"] = {"train": {"Local": ["Local-Loss", "Local-Accuracy"]},
                          "test": {"Local": ["Local-Loss", "Local-Accuracy"],
                                   "Global": ["Global-Loss", "Global-Accuracy"]}}
    seed = job["settings"]["seed"]
    torch.manual_seed(seed)
    dataset = Samples(job["train_x"], job["train_y"])
    data_split, label_split = data_split_of(job), label_split_of(job)
    global_model = conv.conv(model_rate=cfg["global_model_rate"])
    load_initial(global_model, job["init"])
    optimizer = make_optimizer(global_model, cfg["lr"])
    num_active_users = len(job["rates"])
    cfg["active_user"] = num_active_users
    dataset_ref = {"dataset": dataset, "split": data_split["train"], "label_split": label_split}
    server = ResnetServerRoll(global_model, cfg["model_rate"], dataset_ref, cfg)
    log_path = os.path.join("output", "runs", "sidebyside")
    local = [ResnetClient.remote(log_path, [cfg]) for _ in range(num_active_users)]
    states, seconds = [snapshot(server.global_model.state_dict())], []
    # main_resnet.py's round, less its test and checkpoint: broadcast, each client's step, combine
    for _epoch in range(1, cfg["num_epochs"]["global"] + 1):
        t0 = time.perf_counter()
        lr = optimizer.param_groups[0]["lr"]
        local, param_idx, user_idx = server.broadcast(local, lr)
        start = time.time()
        local_parameters = [client.step.remote(m, len(local), start) for m, client in enumerate(local)]
        server.step(local_parameters, param_idx, user_idx)
        seconds.append(time.perf_counter() - t0)
        states.append(snapshot(server.global_model.state_dict()))
    return {"states": states, "seconds": seconds}


def check(job) -> dict:
    """Their slicing (split_model, distribute) and aggregation (combine) on the job's tensors:
    HeteroFL's ``Federation`` and FedRolex's ``ResnetServerRoll`` at the rounds asked for."""
    kind = job["kind"].split(":")[1]
    if kind == "fedrolex":
        install_ray_shim()
    sys.argv = [sys.argv[0]]
    from config import cfg
    from utils import process_control

    configure(cfg, process_control, job)
    if kind == "heterofl":
        import models
        model = models.conv(model_rate=1)
    else:
        from models import conv
        model = conv.conv(model_rate=1)
        cfg["overlap"], cfg["weighting"] = None, "avg"
        cfg["active_user"] = len(job["rates"])
    load_initial(model, job["init"])
    keys = [k for k, v in model.state_dict().items() if v.is_floating_point()]
    users = list(range(len(job["rates"])))
    out = []
    for rnd, locals_ in zip(job["check_rounds"], job["locals"]):
        fresh = copy.deepcopy(model)  # their combine writes into the model's own tensors
        if kind == "heterofl":
            from fed import Federation
            fed = Federation(fresh.state_dict(), cfg["model_rate"], label_split_of(job))
        else:
            from resnet_server import ResnetServerRoll
            fed = ResnetServerRoll(fresh, cfg["model_rate"], {"label_split": label_split_of(job)}, cfg)
            fed.rounds = rnd - 1  # their round counter before round ``rnd``
        sliced, idx = fed.distribute(users)
        local_states = [{k: t.clone() for k, t in zip(keys, tensors)} for tensors in locals_]
        for m, st in enumerate(local_states):
            for k in keys:
                assert st[k].shape == sliced[m][k].shape, (k, st[k].shape, sliced[m][k].shape)
        indices = [{k: [t.clone() for t in (v if isinstance(v, tuple) else (v,))] for k, v in ix.items()} for ix in idx]
        fed.combine(local_states, idx, users)
        combined = fed.global_parameters
        out.append({"round": rnd, "sliced": [[s[k].clone() for k in keys] for s in sliced],
                    "indices": [[ix[k] for k in keys] for ix in indices],
                    "combined": [combined[k].clone() for k in keys]})
    return {"checks": out}


def main() -> None:
    job_path = sys.argv[1]
    sys.path.insert(0, os.getcwd())
    torch.set_num_threads(1)
    stub_missing("anytree")
    job = torch.load(job_path, weights_only=False)
    kind = job["kind"]
    t0 = time.perf_counter()
    if kind == "heterofl":
        out = run_heterofl(job)
    elif kind == "fedrolex":
        out = run_fedrolex(job)
    else:
        out = check(job)
    out["total_seconds"] = time.perf_counter() - t0
    torch.save(out, job_path + ".out")


if __name__ == "__main__":
    main()
