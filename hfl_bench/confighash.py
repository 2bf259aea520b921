"""A run's identity: which settings its config hash covers, and the hash. Kept apart from
``hfl_bench.config`` (which re-exports all of it) so that naming a run's files (``paths``) hashes
its config without passing it through the module that checks and resolves it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Fields that do not change what a run computes: left out of the config hash.
# ``preset`` is hashed through the hyperparameters it sets (``method_params`` once resolved), so
# ``--preset paper`` and the same values by ``--set`` are one run with one hash.
NON_SEMANTIC = ("seed", "device", "data_dir", "download", "out", "exec", "eval_every", "cuda_graphs",
                "checkpoint_every", "preset", "ensemble", "client_state", "client_state_dir")
# Fields added after the first records: left out of the hash at their default (or unset: a field
# whose default is the task's, ``pretrain_size``), so a config that does not use them keeps the hash
# it always had (older records stay comparable).
HASH_NEUTRAL_DEFAULTS = {"public_size": 0, "pretrain_size": 0, "faults": "", "recipient_fraction": None,
                         "missing_modality": None, "optimizer": "sgd", "deadline": None,
                         "eval_clients": None, "capacity_profile": None}
# The simulated clock's settings (``hfl_bench.clock``): they change what a run computes only through a
# deadline, which drops late clients. Without one the clock only observes, so they are left out of the
# hash and a run with ``--devices`` is the same run (same hash, same figures) as one without.
CLOCK_ONLY = ("devices", "device_assignment")
# Settings that no longer exist: ``vmap`` (stacked teacher inference) and ``lockstep`` (same-
# architecture students trained together), batching options removed because they were slower
# than the default wherever they were measured. Records and checkpoints written before carry them
# in their ``config`` (records also as ``federation.vmap`` / ``federation.lockstep``). They never
# changed what a run computes (never hashed), so a config read back from a record or a checkpoint
# drops them (``without_legacy``, ``config_hash``); a config file or a suite that names one is
# refused like any other unknown key.
LEGACY_FIELDS = ("vmap", "lockstep")


def without_legacy(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """A config read back from a record or a checkpoint, without the removed ``LEGACY_FIELDS``."""
    return {k: v for k, v in cfg_dict.items() if k not in LEGACY_FIELDS}


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(cfg_dict: dict[str, Any]) -> str:
    """Hash of everything that changes what a run computes (seed, paths and device excluded; a
    recorded config's legacy settings too, as they always were)."""
    timed = cfg_dict.get("deadline") is not None
    semantic = {k: v for k, v in without_legacy(cfg_dict).items()
                if k not in NON_SEMANTIC and (timed or k not in CLOCK_ONLY)
                and not (k in HASH_NEUTRAL_DEFAULTS and v in (None, HASH_NEUTRAL_DEFAULTS[k]))}
    return hashlib.sha256(canonical_json(semantic).encode()).hexdigest()[:16]
