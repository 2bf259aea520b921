"""A record's identity as the leaderboard reads it: its config hash in the canonical form.

Since issue 28 a run's settings and hyperparameters are canonicalized before they are hashed
(``config.canonical_settings``, ``config.canonical_params``: typed, floats by value, defaults left
out), so ``--set lam=0.7``, ``lam=7e-1`` and no ``--set`` are one run with one hash. Records
written before that keep the hash they were written with; this module maps them at read time:
a record whose ``config.method_params`` is empty and whose float settings are floats (every
record written without ``--set``, all the committed ones) already has the canonical hash and is
read as it is; any other is hashed again from its canonicalized config, so it joins the group of
the same run typed the canonical way. Nothing in the file changes.
"""

from __future__ import annotations

from typing import Any, Optional

from hfl_bench import config as config_mod


def _needs_mapping(cfg: dict[str, Any]) -> bool:
    if cfg.get("method_params"):
        return True
    hints = config_mod.type_hints(config_mod.RunConfig)
    return any(config_mod._is_float_field(hints.get(k)) and isinstance(v, int) and not isinstance(v, bool)
               for k, v in cfg.items())


def canonical_config_dict(cfg: dict[str, Any]) -> dict[str, Any]:
    """A recorded config with its float settings as floats and its hyperparameters in canonical
    form (the method's ``Params`` read from the registry; a method not installed, or values its
    ``Params`` refuse, keep their hyperparameters as recorded)."""
    hints = config_mod.type_hints(config_mod.RunConfig)
    out = {k: (config_mod._float_by_value(v) if config_mod._is_float_field(hints.get(k)) else v)
           for k, v in cfg.items()}
    params = cfg.get("method_params")
    if isinstance(params, dict) and params:
        try:
            from hfl_bench.method_api import get_method_class

            out["method_params"] = config_mod.canonical_params(
                get_method_class(str(cfg.get("method"))).Params, params, str(cfg.get("method")))
        except Exception:  # noqa: BLE001 - an unknown method or a refused value: kept as recorded
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
        return config_mod.config_hash({**canonical_config_dict(cfg), **changes})
    except Exception:  # noqa: BLE001 - a config that cannot be hashed again: read as it says
        return stored
