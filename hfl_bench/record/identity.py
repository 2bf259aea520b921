"""A record's identity: its config hash in the canonical form, which the current schema states.

Since issue 28 a run's settings and hyperparameters are canonicalized before they are hashed
(``config.canonical_settings``, ``config.canonical_params``: typed, floats by value, defaults left
out), so ``--set lam=0.7``, ``lam=7e-1`` and no ``--set`` are one run with one hash. Records
written before that carry the hash they were written with; the upgrade to 1.8 maps it (``upgrade``
calls ``canonical_hash`` once, when the record is read):
a record whose ``config.method_params`` is empty and whose float settings are floats (every
record written without ``--set``, all the committed ones) already has the canonical hash and is
read as it is; any other is hashed again from its canonicalized config, so it joins the group of
the same run typed the canonical way. Nothing in the file changes (its name keeps the stored hash).

Hyperparameters are read against each built-in method's ``Params`` as the code that wrote those
records had them (``hfl_bench.record.legacy_params``, a frozen table), never the method registry:
this module imports no torch and no plugin, and maps a record the same way whatever is installed.
Records of a method version newer than the table's were written canonical, against defaults the
table does not know (FedSocket 1.2's ``extractor=random-conv`` is no default any more), and keep
their hash.
"""

from __future__ import annotations

from typing import Any, Optional

from hfl_bench import config as config_mod
from hfl_bench.record import legacy_params


def _needs_mapping(cfg: dict[str, Any]) -> bool:
    if cfg.get("method_params"):
        return True
    hints = config_mod.type_hints(config_mod.RunConfig)
    return any(config_mod._is_float_field(hints.get(k)) and isinstance(v, int) and not isinstance(v, bool)
               for k, v in cfg.items())


def canonical_config_dict(cfg: dict[str, Any], method_version: Optional[str] = None) -> dict[str, Any]:
    """A recorded config with its float settings as floats and its hyperparameters in canonical
    form, read against the method's ``Params`` as the code that wrote non-canonical records had it
    (``record.legacy_params``, a frozen table, never the registry: the same result whatever is
    installed). ``method_version``: the record's method version (None: unversioned). A method the
    table does not know (a plugin's, one added since), a later version than the table's (written
    canonical, maybe against other defaults), or values the table's ``Params`` refuse: the
    hyperparameters are kept as recorded."""
    hints = config_mod.type_hints(config_mod.RunConfig)
    out = {k: (config_mod._float_by_value(v) if config_mod._is_float_field(hints.get(k)) else v)
           for k, v in cfg.items()}
    params, method = cfg.get("method_params"), cfg.get("method")
    if isinstance(params, dict) and params and legacy_params.covers(method, method_version):
        try:
            out["method_params"] = config_mod.canonical_params(legacy_params.params_class(method), params, method)
        except Exception:  # noqa: BLE001 - a refused value (or key): kept as recorded
            pass
    return out


def canonical_hash(record: dict[str, Any], stored: Any, **changes: Any) -> Optional[str]:
    """``stored`` (a hash the record carries: its ``config_hash``, or its fault baseline's with
    ``faults=""``) mapped to the canonical form; ``stored`` itself when the record needs no
    mapping, or when its config does not hash to what it claims (a hand-edited file is read as
    it says)."""
    cfg = record.get("config")
    if not isinstance(stored, str) or not isinstance(cfg, dict) or not _needs_mapping(cfg):
        return stored if isinstance(stored, str) else None
    try:
        if config_mod.config_hash({**cfg, **changes}) != stored:
            return stored
        method = record.get("method")
        version = method.get("version") if isinstance(method, dict) else None
        return config_mod.config_hash({**canonical_config_dict(cfg, version), **changes})
    except Exception:  # noqa: BLE001 - a config that cannot be hashed again: read as it says
        return stored
