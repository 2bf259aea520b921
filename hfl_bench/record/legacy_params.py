"""Every built-in method's hyperparameters as records written before canonical hyperparameters
meant them: a frozen table, so that ``hfl_bench.record.identity`` maps an old record's config hash
without importing the method registry (no torch, no plugins: the same identity whatever is installed).

Since commit 81932ac ("One identity per run") a run's ``method_params`` are canonicalized before they
are hashed (``config.canonical_params``: typed by the method's ``Params``, floats by value, values
equal to their default left out). Records written before were hashed from the values as typed, and
the code that wrote them last is 81932ac's parent (77542b4), so what each built-in method's
``Params`` was there is what an old record's ``--set`` values are canonicalized against.

A shared-types module: it imports only the standard library.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Optional

# The table: per built-in method at 81932ac^, its version then and its ``Params`` fields in order, each
# (name, type tag, default); every field had a plain default (no default_factory), and no field
# was a bool or a tuple. Generated ONCE by a throwaway script that checked out 81932ac^ in a temporary
# worktree, imported its registry (``hfl_bench.registry.METHODS``) and printed each class's
# ``dataclasses.fields`` and ``typing.get_type_hints``. NEVER regenerate it from the live registry:
# it is what old records meant, and must not follow a Params edited later (FedCC 1.1 / 1.2, FedMD
# 1.1, FedSocket and Naive Shared 1.1 / 1.2 changed defaults and types) or a plugin installed now.
# tests/test_identity.py checks it against the live registry where a field is unchanged.
LEGACY_PARAMS: dict[str, tuple[str, tuple[tuple[str, str, Any], ...]]] = {
    "crad": ("1.0", (
        ("lam", "float", 0.7), ("temperature", "float", 2.0), ("aggregator", "str", "crad"),
        ("min_support", "float", 2.0), ("dp_epsilon", "float | None", None),
    )),
    "dfml": ("1.1", (("epochs", "int | None", None), ("alpha_max", "float", 0.8), ("period", "int", 10))),
    "fedavg": ("1.0", ()),
    "fedcc": ("1.0", (
        ("optimizer", "str", "adam"), ("adam_lr", "float", 0.001), ("tau", "float", 1.0), ("lam", "float", 0.2),
        ("delta", "float", 0.001), ("majority_share", "float", 0.02), ("sync_epochs", "int", 1),
        ("pseudo_epochs", "int", 1),
    )),
    "fedgd": ("1.0", (
        ("digest_loss", "str", "l1"), ("digest_epochs", "int", 1), ("digest_lr", "float", 0.001),
        ("revisit_epochs", "int | None", None), ("temperature", "float", 2.0), ("synthetic_size", "int", 500),
        ("g_steps", "int", 3), ("g_batch_size", "int", 64), ("lr_g", "float", 0.002), ("z_dim", "int", 256),
        ("lambda_bn", "float", 10.0), ("lambda_oh", "float", 0.5), ("lambda_adv", "float", 1.0),
        ("output_range", "float", 3.0),
    )),
    "fedmd": ("1.0", (
        ("digest_loss", "str", "l1"), ("digest_epochs", "int", 1), ("digest_lr", "float", 0.001),
        ("revisit_epochs", "int | None", None), ("temperature", "float", 2.0), ("transfer_epochs", "int", 5),
        ("private_init_epochs", "int", 2), ("alignment_size", "int", 0),
    )),
    "fedmkd": ("1.0", (("lam", "float", 0.5), ("mu", "float", 0.5), ("temperature", "float", 2.0))),
    "fedsocket": ("1.0", (
        ("extractor", "str", "random-conv"), ("feature_dim", "int", 256), ("hidden_dim", "int", 256),
        ("rank", "int", 32), ("lambda_kd", "float", 0.5), ("lambda_fus", "float", 0.25), ("lambda_rel", "float", 0.2),
        ("label_smoothing", "float", 0.1), ("temperature", "float", 2.0), ("private_lr", "float", 0.05),
        ("q_lr", "float", 0.0003), ("local_epochs", "int", 2), ("warmup_epochs", "int", 10),
        ("server_keep", "float", 0.5), ("fusion_rho", "float", 1.0), ("rho_grid", "str", "0.25,0.5,1,2,4"),
        ("endpoint", "str", "private"),
    )),
    "fml": ("1.0", (("alpha", "float", 0.5), ("beta", "float", 0.5), ("meme_arch", "str", "auto"))),
    "local": ("1.0", ()),
    "msfkd": ("1.0", (
        ("tau", "float", 0.5), ("temperature", "float", 2.0), ("distill_epochs", "int", 1), ("local_epochs", "int", 0),
    )),
    "naive-shared": ("1.0", (
        ("extractor", "str", "random-conv"), ("feature_dim", "int", 256), ("hidden_dim", "int", 256),
        ("rank", "int", 32), ("private_lr", "float", 0.05), ("q_lr", "float", 0.0003), ("local_epochs", "int", 2),
        ("warmup_epochs", "int", 10), ("rho_grid", "str", "0.25,0.5,1,2,4"), ("endpoint", "str", "private"),
    )),
    "uncertainty-kd": ("1.0", (
        ("lam", "float", 0.7), ("temperature", "float", 2.0), ("aggregator", "str", "entropy"),
        ("min_support", "float", 2.0), ("dp_epsilon", "float | None", None),
    )),
    "uniform-kd": ("1.0", (
        ("lam", "float", 0.7), ("temperature", "float", 2.0), ("aggregator", "str", "uniform"),
        ("min_support", "float", 2.0), ("dp_epsilon", "float | None", None),
    )),
}

# The type tags of the table, as the annotations ``config.canonical_params`` reads.
TYPES: dict[str, Any] = {"float": float, "int": int, "str": str, "bool": bool,
                         "float | None": float | None, "int | None": int | None}

_VERSION = re.compile(r"\d+(\.\d+)*")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def covers(method: Any, version: Any) -> bool:
    """Whether the table is ``method``'s ``Params`` for a record of method ``version``: a built-in
    method at the version it had at 81932ac^ or an earlier one, or unversioned (a record written
    before methods had versions). A later version was written after 81932ac, canonical already."""
    entry = LEGACY_PARAMS.get(method) if isinstance(method, str) else None
    if entry is None:
        return False
    if version is None:
        return True
    return (isinstance(version, str) and _VERSION.fullmatch(version) is not None
            and _version_key(version) <= _version_key(entry[0]))


@functools.lru_cache(maxsize=None)
def params_class(method: str) -> Optional[type]:
    """A stand-in for built-in ``method``'s ``Params`` at 81932ac^ (a dataclass of the table's fields,
    types and defaults, what ``config.canonical_params`` reads), or None for a method the table does
    not know. One class per method (``config.type_hints`` caches by class)."""
    entry = LEGACY_PARAMS.get(method)
    if entry is None:
        return None
    fields = [(name, TYPES[tag], dataclasses.field(default=default)) for name, tag, default in entry[1]]
    class_name = "Legacy_" + re.sub(r"\W", "_", method) + "_Params"  # a valid identifier
    return dataclasses.make_dataclass(class_name, fields, frozen=True)
