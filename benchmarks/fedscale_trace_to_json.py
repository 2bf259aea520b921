"""Convert FedScale's availability trace (``client_behave_trace``, a pickle) to the JSON that
``hfl-bench run --devices PROFILE`` reads (a profile's ``traces: FILE``; docs: Devices and the
simulated clock).

    python benchmarks/fedscale_trace_to_json.py client_behave_trace traces.json [--clients 100]

A pickle can run code when it is loaded, so this never calls ``pickle.load``: a restricted
unpickler finds no global at all, so only plain containers and numbers (dicts, lists, tuples,
ints, floats, strings) load; anything else stops the conversion with one line. The layout is
FedScale's: client key -> {"active": [...], "inactive": [...], "finish_time": ...}, seconds.
``--clients N`` keeps the first N clients (by key), enough for a run of N clients.
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import sys
from pathlib import Path

FIELDS = ("active", "inactive", "finish_time")


class PlainUnpickler(pickle.Unpickler):
    """Loads dicts, lists, tuples, numbers and strings only: no class, no function."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"the trace names {module}.{name}; only plain data is read")


def plain_load(data: bytes):
    return PlainUnpickler(io.BytesIO(data)).load()


def convert(data: bytes, limit: int | None = None) -> dict[str, dict]:
    """FedScale's trace (pickle bytes) as a JSON-ready mapping (client key -> trace)."""
    trace = plain_load(data)
    if not isinstance(trace, dict):
        raise ValueError(f"the trace is a {type(trace).__name__}, not a dict of client -> trace")
    keys = sorted(trace, key=lambda k: (0, k, "") if isinstance(k, int) else (1, 0, str(k)))
    out = {}
    for key in keys[:limit]:
        entry = trace[key]
        if not isinstance(entry, dict) or not set(FIELDS) <= set(entry):
            raise ValueError(f"client {key!r}: not a trace with {', '.join(FIELDS)}")
        out[str(key)] = {"active": [float(t) for t in entry["active"]],
                         "inactive": [float(t) for t in entry["inactive"]],
                         "finish_time": float(entry["finish_time"])}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="FedScale's client_behave_trace (a pickle)")
    parser.add_argument("out", type=Path, help="the JSON file to write")
    parser.add_argument("--clients", type=int, default=None, help="keep the first N clients (by key)")
    args = parser.parse_args(argv)
    try:
        converted = convert(args.trace.read_bytes(), args.clients)
    except (OSError, ValueError, pickle.UnpicklingError, EOFError) as e:
        print(f"error: {args.trace.name}: {e}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(converted, indent=1) + "\n")
    print(f"{len(converted)} client traces written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
