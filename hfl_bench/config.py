"""Run configuration: one dataclass, filled from task defaults, a YAML file and CLI flags."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Union

from hfl_bench.confighash import (  # noqa: F401 (re-exported: a run's identity)
    HASH_NEUTRAL_DEFAULTS,
    LEGACY_FIELDS,
    NON_SEMANTIC,
    canonical_json,
    config_hash,
    without_legacy,
)
from hfl_bench.errors import ConfigError  # noqa: F401 (re-exported: defined below the config so capacity can raise it)

SEED_LIMIT = 2**63  # seeds are in [0, 2^63): torch and the seed derivation take 63-bit integers


def param(default, help: str, **kw):
    """A dataclass field with help text: ``lam: float = param(0.7, "Distillation weight.")``. Used by
    every method's ``Params``; ``hfl-bench describe`` shows the text."""
    return field(default=default, metadata={"help": help}, **kw)


def setting(default, help: str, *, flags: tuple[str, ...] | None = (), path: bool = False):
    """A RunConfig field: its help text, and how ``hfl-bench run`` offers it (``hfl_bench.cli.options``
    makes the options from these). ``flags``: the option's names, default ``--field-name``; None
    when the setting is set in a config file only. ``path``: the value names a file or folder."""
    return field(default=default, metadata={"help": help, "flags": flags, "path": path})


def require_at_least(owner: str, params: Any, names: tuple[str, ...], minimum: float) -> None:
    """Each named field of ``params`` must be >= ``minimum`` (ConfigError naming it and ``owner``)."""
    for name in names:
        value = getattr(params, name)
        if value < minimum:
            raise ConfigError(f"{owner}: {name} must be >= {minimum}, got {value}")


# A record's final figures average the last this many rounds; the evaluator tests each of them.
FINAL_ROUNDS = 10
# The record's ``selection.rule``: the round of best mean validation accuracy over every client
# (``evaluation.select_round``; each client's accuracy on its own validation half), under --faults
# too. Records written before that rule held under faults say ``faults.selection: "honest"`` (the
# honest clients' validation, which no server can know): the results layer keeps them apart
# (``results.grouping.selection_rule``).
SELECTION_RULE = "best_mean_local_val"
# The rule of a run whose partition gives every client's validation half at most one class
# (``--partition classes --classes-per-client 1``): there any model that predicts its client's
# class scores 100 % on its own half, so the rule above would always select round 1. Such a run
# selects on pooled validation instead: each client's model on the union of every client's
# validation half (``evaluation.selection_rule`` decides, once per run, from the partition alone).
POOLED_SELECTION_RULE = "best_mean_pooled_val"
# A client holds (has seen) a class when its training split has at least this many samples of it;
# its other classes are unseen (the record's seen / unseen-class accuracy, hfl_bench.evaluation).
# One sample: the only bar that needs no scale of the task's, and "unseen" then means exactly
# "never trained on locally", so whatever a client knows of such a class came through the federation.
HELD_MIN_TRAIN_COUNT = 1
# Test rounds every k rounds by default (hfl_bench.evaluation; README, Performance).
EVAL_EVERY = 10


@dataclass
class RunConfig:
    """One run's settings. A config file's keys are these field names; ``hfl-bench run`` has one
    option per field that has flags, with the field's help text."""

    method: str = setting("crad", "Method name (hfl-bench list methods).", flags=("--method", "-m"))
    preset: str | None = setting(None, "A named set of the method's hyperparameters (hfl-bench describe METHOD lists "
                                       "them), e.g. paper: the paper's own budget where it differs from the "
                                       "protocol's; --set overrides its values. Default: none (the protocol's budget).")
    task: str = setting("digits", "Task name (hfl-bench list tasks).", flags=("--task", "-t"))
    pool: str | None = setting(None, "Architecture pool (hfl-bench list pools); default: the task's.")
    partition: str | None = setting(None, "Partitioner (hfl-bench list partitioners): dirichlet, classes or iid; "
                                          "default: the task's.")
    alpha: float | None = setting(None, "Dirichlet concentration, > 0 (smaller is more skewed); default: the task's.")
    classes_per_client: int = setting(2, "Classes per client k for the classes partitioner (k = 1 allowed).",
                                      flags=("--k",))
    capacity_profile: str | None = setting(None, "Each client's architecture picked by a capacity profile, as the "
                                                 "sub-model methods' profile (e.g. a1-b1-c1-d1-e1) picks its width: "
                                                 "with a levels pool (--pool heterofl-cnn-levels), client i gets the "
                                                 "model at the width the sub-model methods give client i under that "
                                                 "profile and the run's seed, as its own architecture. Default: none "
                                                 "(the pool's round-robin). Part of the config hash when set.")
    clients: int | None = setting(None, "Number of clients N; default: the task's.")
    clients_per_round: int | None = setting(None, "Active clients per round (a seeded draw); default: all.")
    rounds: int | None = setting(None, "Communication rounds R; default: the task's.")
    local_epochs: int | None = setting(None, "Local epochs per round; default: the task's, else 1.")
    batch_size: int | None = setting(None, "Local batch size; default: the task's, else 64.")
    optimizer: str = setting("sgd", "The clients' optimizer, one for every method of a comparison: sgd (the "
                                    "protocol's: --lr with the run's momentum and weight decay) or adam (Adam at "
                                    "--lr, betas 0.9 / 0.999, no weight decay: e.g. --optimizer adam --lr 0.001, "
                                    "FedCC's paper recipe; a momentum or weight decay other than the task's default "
                                    "is refused with it). A method's own extra optimizers (a digest step's, a "
                                    "generator's) keep their rules.")
    lr: float | None = setting(None, "Learning rate of the clients' optimizer; default: the task's, else 0.01.")
    momentum: float | None = setting(None, "SGD momentum; default: the task's, else 0.9 (with --optimizer adam, "
                                           "which takes none, only the default).", flags=None)
    weight_decay: float | None = setting(None, "SGD weight decay; default: the task's, else 5e-4 (with --optimizer "
                                               "adam, which takes none, only the default).", flags=None)
    grad_clip: float = setting(10.0, "Gradient clipping (global norm); 0 disables.", flags=None)
    heldout_fraction: float | None = setting(None, "Fraction of each client shard held out, split evenly into "
                                                   "validation and test; default: the task's, else 0.2.")
    public_size: int = setting(0, "Training samples held out (stratified, before partitioning) as a public transfer "
                                  "set, for the methods that need one (hfl-bench describe METHOD says); 0 = none.")
    pretrain_size: int | None = setting(None, "Training samples held out (stratified, before partitioning, like the "
                                              "public set) as a pretraining split: no client holds them; a frozen "
                                              "feature encoder (fedsocket's extractor=pretrained) is trained on them "
                                              "once. A data setting: every method of a comparison holds out the same "
                                              "N. Default: the task's (digits-mnist1d 144), else 0 = none.")
    faults: str = setting("", "One fault per run, KIND:WHO[@STRENGTH][/MODE]: KIND label-noise, byzantine, free-rider "
                              "or straggler; WHO a fraction of the clients (a seeded draw) or a list [1,3]; e.g. "
                              "byzantine:0.2, label-noise:0.3@0.5/pair. Empty or none: no faults (README, Faults).")
    devices: str = setting("", "Device profile for the simulated clock: a preset (uniform, mixed-phones) or a "
                               "YAML/JSON file (docs: Devices and the simulated clock). Each round gets a simulated "
                               "time; training is unchanged unless --deadline is set. Empty or none: no clock.")
    device_assignment: str = setting("random", "Which client gets which device: random (seeded) or by-size (larger "
                                               "architectures, by training FLOPs per sample, to faster devices).")
    deadline: float | None = setting(None, "Round deadline in simulated seconds (needs --devices): a client expected "
                                           "to finish later, or unavailable at the round's start, is dropped from "
                                           "the round (it trains and sends nothing). Default: none.")
    recipient_fraction: float | None = setting(None, "Multimodal tasks: the fraction of clients (a seeded draw) that "
                                                     "are recipients, missing --missing-modality; default: the task's "
                                                     "(0.5).")
    missing_modality: str | None = setting(None, "Multimodal tasks: the modality recipients do not observe; default: "
                                                 "the task's (hfl-bench describe TASK lists its modalities).")
    seed: int | None = setting(None, "Run seed (python, numpy, torch, partition); default: the task's, else 0.")
    eval_every: int = setting(EVAL_EVERY, "Test rounds (global test set, local test halves, extra endpoints) every "
                                          "k rounds, plus each of the last 10 rounds and the selected round; "
                                          "validation runs every round. 1 tests every round.")
    eval_clients: int | None = setting(None, "Sampled evaluation: test rounds outside the final window (the last "
                                             "10 rounds, which test every client) test a seeded draw of K clients "
                                             "(run seed and round; a stream of its own) and report their means; "
                                             "validation (selection) still covers every client whose model changed. "
                                             "Default: every client. Part of the config hash when set.")
    client_state: str = setting("resident", "Where clients' models, optimizer state and gradients wait between their "
                                            "rounds: resident (on the run's device), host (in host memory) or disk "
                                            "(files under --client-state-dir); a drawn client's state is restored "
                                            "before use, bit for bit, so figures and the config hash are unchanged.")
    client_state_dir: str | None = setting(None, "Folder the disk client state is kept under (a temporary folder "
                                                 "per run, removed when it ends); default: <out>/.client-state.",
                                           path=True)
    ensemble: bool = setting(False, "Also evaluate the plain ensemble of every client's evaluated model (the mean of "
                                    "their softmaxes) as the extra endpoint 'ensemble', for every method alike (a "
                                    "method with an ensemble of its own, FedCC's, reports that one). Evaluation "
                                    "only: training and the config hash are unchanged; none on a multimodal task.")
    device: str = setting("auto", "auto (cuda if available, else cpu), cpu, cuda or cuda:N.")
    exec: str = setting("auto", "Peer-KD execution path: reference (per batch, as Algorithm 1), fast (each teacher "
                                "runs once over all its students' views) or auto (= fast).")
    cuda_graphs: str = setting("auto", "Student SGD steps captured once per model and batch shape and replayed as CUDA "
                                       "graphs: on, off or auto (= off until measured on a GPU; a CPU run never "
                                       "uses them).")
    data_dir: str | None = setting(None, "Dataset folder; default: $HFL_BENCH_DATA or ~/.cache/hfl-bench/data.",
                                   path=True)
    download: bool = setting(False, "Download the dataset if it is missing.")
    out: str = setting("runs", "Folder the JSON record is written to.", path=True)
    checkpoint_every: int = setting(10, "Save a checkpoint every k rounds (under <out>/.checkpoints; --resume "
                                        "continues from it); 0 = never.")
    method_params: dict[str, Any] = setting(None, "Method hyperparameters (on the command line: --set key=value).",
                                            flags=None)

    def __post_init__(self):
        if self.method_params is None:
            self.method_params = {}


# Where clients' state waits between their rounds (``--client-state``; ``hfl_bench.clientstate``).
CLIENT_STATES = ("resident", "host", "disk")
# The devices a run may name (hfl_bench.engine.pick_device checks what this machine has).
DEVICES = "auto, cpu, cuda or cuda:N"
DEVICE_NAME = re.compile(r"auto|cpu|cuda(:[0-9]+)?")

FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
# The clients' optimizers a run may name (``--optimizer``; ``federation.Federation.make_optimizer``).
OPTIMIZERS = ("sgd", "adam")
# The settings an optimizer does not read (``federation.Federation.make_optimizer`` builds Adam
# from --lr alone), refused by ``resolve`` when set to other than the task's default: the run would
# train exactly as with the default, yet hash apart (two records, two leaderboard groups; issue 63).
# Not left out of the hash instead: the committed Adam records hash the task's defaults.
IGNORED_BY_OPTIMIZER = {"adam": ("momentum", "weight_decay")}
def recorded_config(cfg_dict: dict[str, Any]) -> RunConfig:
    """The ``RunConfig`` of a record's or a checkpoint's ``config`` (legacy settings dropped; a
    setting added since, which the record lacks, at the value it then had: ``HASH_NEUTRAL_DEFAULTS``)."""
    values = without_legacy(cfg_dict)
    return RunConfig(**{**{k: v for k, v in HASH_NEUTRAL_DEFAULTS.items() if k not in values}, **values})


def read_yaml_mapping(path: str | Path, what: str, expected: str) -> dict[str, Any]:
    """A YAML file holding a mapping (an empty file is an empty one), read within bounds
    (``hfl_bench.yamlfile``); ConfigError, one line, otherwise."""
    from hfl_bench.yamlfile import YamlFileError, read_mapping

    try:
        return read_mapping(path, what, expected)
    except YamlFileError as e:
        raise ConfigError(str(e)) from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    data = read_yaml_mapping(path, "config file", "of settings")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise ConfigError(f"unknown setting(s) in {path}: {', '.join(map(str, unknown))}. Known: {', '.join(FIELDS)}")
    params = data.get("method_params")
    if params is not None and not (isinstance(params, dict) and all(isinstance(k, str) for k in params)):
        raise ConfigError(f"method_params in {path} must be a mapping of hyperparameters, got {_short(params)}")
    return empty_faults_as_none(data)


def empty_faults_as_none(settings: dict[str, Any]) -> dict[str, Any]:
    """``faults:`` with an empty value means no faults, as ``--faults ''`` does (YAML reads it as null)."""
    for name in ("faults", "devices"):
        if name in settings and settings[name] is None:
            settings[name] = ""
    return settings


# What an unset setting becomes when the task does not set it either. Tasks may set any of these
# (``TaskInfo.defaults``): the optimizer and the held-out fraction are part of a task's protocol.
FALLBACK_DEFAULTS: dict[str, Any] = {
    "pool": "cpu", "partition": "dirichlet", "alpha": 0.3, "clients": 10, "rounds": 100, "seed": 0,
    "local_epochs": 1, "batch_size": 64, "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4,
    "heldout_fraction": 0.2, "pretrain_size": 0,
}


def resolve(cfg: RunConfig, task_defaults: dict[str, Any]) -> RunConfig:
    """Fill the unset (None) fields from the task's protocol defaults, then from global ones. A
    setting the run's optimizer does not read, set to other than its default, is a ConfigError
    (``IGNORED_BY_OPTIMIZER``)."""
    fallback = dict(FALLBACK_DEFAULTS)
    values = dataclasses.asdict(cfg)
    for name, value in values.items():
        if value is None and (name in fallback or name in task_defaults):  # a multimodal task's own settings too
            values[name] = task_defaults.get(name, fallback.get(name))
    for name in IGNORED_BY_OPTIMIZER.get(cfg.optimizer, ()):
        given, default = getattr(cfg, name), task_defaults.get(name, fallback.get(name))
        if given is not None and given != default:
            raise ConfigError(f"{name} {given} is set, but --optimizer {cfg.optimizer} does not use it (Adam at "
                              f"--lr, no momentum or weight decay): drop {name}, or use --optimizer sgd")
    if values.get("eval_clients") is not None and values["eval_clients"] >= values["clients"]:
        values["eval_clients"] = None  # a sample of every client is every client: one run, one hash
    out = RunConfig(**values)
    validate(out)
    return out


def resolve_settings(settings: dict[str, Any] | RunConfig,
                     task_defaults: Callable[[str, Any], dict[str, Any]],
                     method_defaults: Callable[[str], dict[str, Any]] | None = None) -> RunConfig:
    """A run's settings through this module once: built into a ``RunConfig`` (an unknown setting
    is a ConfigError naming the known ones), checked (``validate``), filled from the task's
    defaults (``task_defaults(task, data_dir)``, asked only once the values passed: a bad value never reaches
    the task, nor imports torch) and the global ones, checked again, its floats in their one
    hashed form (``canonical_settings``). ``method_defaults(method)`` (a method that brings its own
    model family names its pool) wins over the task's defaults; a value the settings give wins over both."""
    if isinstance(settings, RunConfig):
        cfg = settings
    else:
        unknown = sorted(set(settings) - set(FIELDS))
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(map(str, unknown))}. Known: {', '.join(FIELDS)}")
        cfg = RunConfig(**empty_faults_as_none(dict(settings)))
    validate(cfg)
    defaults = {**task_defaults(cfg.task, cfg.data_dir), **(method_defaults(cfg.method) if method_defaults else {})}
    return canonical_settings(resolve(cfg, defaults))


def validate(cfg: RunConfig) -> None:
    """Every setting of the right type, finite and in range; ConfigError (one line) otherwise.
    Unset (None) settings pass: ``resolve`` fills them from the task and checks again. Called before
    any data loads, by everything that takes a config (run, matrix cells, partition, --config)."""
    check_types(cfg, type_hints(RunConfig), "setting")
    seed_ok = cfg.seed is None or 0 <= cfg.seed < SEED_LIMIT
    checks = [
        (cfg.alpha is None or cfg.alpha > 0, f"--alpha must be > 0, got {cfg.alpha}"),
        (cfg.clients is None or cfg.clients >= 1, f"--clients must be >= 1, got {cfg.clients}"),
        (cfg.rounds is None or cfg.rounds >= 1, f"--rounds must be >= 1, got {cfg.rounds}"),
        (cfg.classes_per_client >= 1, f"--k (classes per client) must be >= 1, got {cfg.classes_per_client}"),
        (cfg.local_epochs is None or cfg.local_epochs >= 1, f"--local-epochs must be >= 1, got {cfg.local_epochs}"),
        (cfg.eval_every >= 1, f"--eval-every must be >= 1, got {cfg.eval_every}"),
        (cfg.checkpoint_every >= 0, f"--checkpoint-every must be >= 0, got {cfg.checkpoint_every}"),
        (cfg.batch_size is None or cfg.batch_size >= 2, f"--batch-size must be >= 2, got {cfg.batch_size}"),
        (cfg.lr is None or cfg.lr > 0, f"--lr must be > 0, got {cfg.lr}"),
        (cfg.optimizer in OPTIMIZERS, f"--optimizer must be {' or '.join(OPTIMIZERS)}, got {cfg.optimizer!r}"),
        (cfg.momentum is None or 0 <= cfg.momentum < 1, f"momentum must be in [0, 1), got {cfg.momentum}"),
        (cfg.weight_decay is None or cfg.weight_decay >= 0, f"weight_decay must be >= 0, got {cfg.weight_decay}"),
        (cfg.grad_clip >= 0, f"grad_clip must be >= 0 (0 disables clipping), got {cfg.grad_clip}"),
        (cfg.heldout_fraction is None or 0 <= cfg.heldout_fraction < 1,
         f"heldout_fraction must be in [0, 1), got {cfg.heldout_fraction}"),
        (cfg.public_size >= 0, f"--public-size must be >= 0, got {cfg.public_size}"),
        (cfg.pretrain_size is None or cfg.pretrain_size >= 0, f"--pretrain-size must be >= 0, got {cfg.pretrain_size}"),
        (cfg.recipient_fraction is None or 0 <= cfg.recipient_fraction <= 1,
         f"--recipient-fraction must be in [0, 1], got {cfg.recipient_fraction}"),
        (seed_ok, f"--seed must be in [0, 2^63), got {cfg.seed}"),
        (cfg.exec in ("auto", "reference", "fast"), f"--exec must be auto, reference or fast, got {cfg.exec!r}"),
        (cfg.cuda_graphs in ("auto", "on", "off"), f"--cuda-graphs must be auto, on or off, got {cfg.cuda_graphs!r}"),
        (DEVICE_NAME.fullmatch(cfg.device) is not None, f"unknown device {cfg.device!r}: --device must be {DEVICES}"),
        (cfg.device_assignment in ("random", "by-size"),
         f"--device-assignment must be random or by-size, got {cfg.device_assignment!r}"),
        (cfg.deadline is None or cfg.deadline > 0, f"--deadline must be > 0 seconds, got {cfg.deadline}"),
        (cfg.deadline is None or cfg.devices.strip().lower() not in ("", "none"),
         "--deadline needs --devices (a preset or a profile file): the clock it applies to"),
        (cfg.eval_clients is None or cfg.eval_clients >= 1, f"--eval-clients must be >= 1, got {cfg.eval_clients}"),
        (cfg.client_state in CLIENT_STATES,
         f"--client-state must be {', '.join(CLIENT_STATES)}, got {cfg.client_state!r}"),
        (cfg.clients_per_round is None or cfg.clients_per_round >= 1,
         f"--clients-per-round must be >= 1, got {cfg.clients_per_round}"),
        (bool(cfg.method.strip()) and bool(cfg.task.strip()), "--method and --task must not be empty"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    if cfg.capacity_profile is not None:
        from hfl_bench.capacity import parse_profile  # here: it loads only when a profile is set

        parse_profile(cfg.capacity_profile)
    if cfg.clients_per_round is not None and cfg.clients is not None and cfg.clients_per_round > cfg.clients:
        raise ConfigError(f"--clients-per-round ({cfg.clients_per_round}) exceeds --clients ({cfg.clients})")


@functools.lru_cache(maxsize=None)
def type_hints(cls: type) -> dict[str, Any]:
    """A dataclass's field types, resolved (``from __future__ import annotations`` makes them strings)."""
    return typing.get_type_hints(cls)


def check_types(obj: Any, hints: dict[str, Any], what: str, owner: str = "") -> None:
    """Each dataclass field of ``obj`` holds a value of its annotated type, and floats are finite."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        hint = hints.get(f.name, Any)
        prefix = f"{owner}: " if owner else ""
        if not _has_type(value, hint):
            raise ConfigError(f"{prefix}{what} {f.name!r} must be {_type_name(hint)}, got {_short(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}{what} {f.name!r} must be a finite number, got {value}")


def _has_type(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_has_type(value, h) for h in typing.get_args(hint))
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # an integer is a fine float (YAML "lr: 1")
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    return isinstance(value, origin or hint)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "none"}
    if typing.get_origin(hint) is dict:
        return "a mapping"
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _float_by_value(value: Any, name: str = "a float setting") -> Any:
    """A number of a float field as a float (YAML ``1`` and ``1.0`` are one value; ``-0.0`` is ``0.0``);
    ConfigError naming ``name`` for an integer past the largest float."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value) + 0.0
        except OverflowError:  # a YAML integer of hundreds of digits
            raise ConfigError(f"{name}: {_short(value)} is too large for a number") from None
    return value


def _is_float_field(hint: Any) -> bool:
    args = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
    return float in args and int not in args


def canonical_settings(cfg: RunConfig) -> RunConfig:
    """``cfg`` with every number of a float setting a float (``lr: 1`` in YAML and ``--lr 1.0`` are
    one run, one config hash); the rest as it is."""
    hints = type_hints(RunConfig)
    changes = {}
    for name in FIELDS:
        value = getattr(cfg, name)
        if _is_float_field(hints.get(name)) and value is not None:
            if (number := _float_by_value(value, name)) is not value:
                changes[name] = number
    return dataclasses.replace(cfg, **changes) if changes else cfg


def canonical_params(params_cls: type, raw: dict[str, Any], method: str) -> dict[str, Any]:
    """A run's ``method_params`` in the one form that is hashed and recorded, however they were
    typed (``--set lam=0.7``, ``lam=0.70``, ``lam=7e-1``, YAML ``lam: 0.7``): coerced to the
    ``Params`` field types (``coerce_params``, its errors included), floats by value, and the
    hyperparameters equal to the method's default left out, so a run that sets a default is the
    run that does not set it (and records written without ``--set`` keep their hash)."""
    params = coerce_params(params_cls, raw, method)
    hints = type_hints(params_cls)

    def by_value(name: str, value: Any) -> Any:
        return _float_by_value(value, f"{method}: {name}") if _is_float_field(hints.get(name, Any)) else value

    canonical = {}
    for f in dataclasses.fields(params_cls):
        if f.name not in raw:
            continue
        value = by_value(f.name, getattr(params, f.name))
        if f.default is dataclasses.MISSING or canonical_json(value) != canonical_json(by_value(f.name, f.default)):
            canonical[f.name] = value  # a field without a plain default is kept as given
    return canonical


def parse_set(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def coerce_params(params_cls, raw: dict[str, Any], method: str):
    """Build a method's hyperparameter dataclass from strings or YAML values, with clear errors:
    an unknown key, a value of the wrong type, a number that is not finite."""
    if not isinstance(raw, dict):
        raise ConfigError(f"method_params of {method!r} must be a mapping of hyperparameters, got {_short(raw)}")
    known = {f.name: f for f in dataclasses.fields(params_cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        import difflib

        close = [(k, m[0]) for k in unknown if (m := difflib.get_close_matches(k, list(known), n=1))]
        hint = (f" Did you mean {close[0][1]!r}?" if len(unknown) == 1 and close
                else f" Did you mean {', '.join(f'{m!r} for {k!r}' for k, m in close)}?" if close else "")
        raise ConfigError(
            f"unknown hyperparameter(s) for method {method!r}: {', '.join(unknown)}.{hint} "
            f"Known: {', '.join(known) or '(none)'}"
        )
    values = {}
    hints = type_hints(params_cls)
    for key, value in raw.items():
        default = known[key].default
        values[key] = _coerce(value, default, key, method, hints.get(key, Any))
    params = params_cls(**values)
    check_types(params, type_hints(params_cls), "hyperparameter", owner=method)
    return params


def _optional_types(hint: Any) -> tuple[Any, ...]:
    """The types of an optional field's hint besides None (``int | None`` -> (int,))."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
    return tuple(a for a in args if a is not type(None))


def _coerce(value: Any, default: Any, key: str, method: str, hint: Any = Any):
    if not isinstance(value, str) or isinstance(default, str):
        return value
    try:
        if isinstance(default, bool):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if isinstance(default, int):
            return int(value)
        if default is None:  # an optional field: "none" unsets it, a number is a number, else a string
            if value.lower() in ("none", "null", ""):
                return None
            if int in _optional_types(hint):  # ``epochs: int | None``: "3" is 3 (a float would be refused)
                return int(value)
            try:
                return float(value)
            except ValueError:
                return value
        if isinstance(default, float):
            return float(value)
    except ValueError:
        if default is None:
            raise ConfigError(f"{method}: {key}={value!r} is not {_type_name(hint)}") from None
        raise ConfigError(f"{method}: {key}={value!r} is not a valid {type(default).__name__}") from None
    return value
