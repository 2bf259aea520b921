"""Made tests/golden/older-records-read-at-38a633c.json.gz: how the code at 38a633c (the last before
the record upgrade, whose readers fell back on the registry for what an older record lacks) read
every committed record older than schema 1.7: the whole board and, per record, the setting fields
and the headline. tests/test_record_upgrade.py holds today's reading of the same records to it.

    git worktree add BASE 38a633c
    python tests/golden/make_older_records.py BASE . OUT.json && gzip -9 -n OUT.json

Run with an environment where hfl-bench is installed; BASE goes first on sys.path, so its
``hfl_bench`` is the one imported (its ``hfl_bench.methods`` resolves to the installed checkout's,
whose cards' setting fields are those of 38a633c: the frozen table's test says so)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(sys.argv[1]).resolve()))
import hfl_bench  # noqa: E402

assert Path(hfl_bench.__file__).resolve().is_relative_to(Path(sys.argv[1]).resolve()), hfl_bench.__file__
from hfl_bench.results import headline as hl  # noqa: E402
from hfl_bench.results import setting as st  # noqa: E402
from hfl_bench.results.board import build_board  # noqa: E402
from hfl_bench.results.loading import Loaded  # noqa: E402
from hfl_bench.results.render import board_json  # noqa: E402

REPO = Path(sys.argv[2]).resolve()
out = []
for root in ("leaderboards", "tests/pins"):
    for path in sorted((REPO / root).rglob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except Exception:
            continue
        if isinstance(record, dict) and "schema_version" in record and record["schema_version"] != "1.7":
            out.append((path, record))
raw = [Loaded(p.relative_to(REPO), r) for p, r in out]
board = board_json(build_board(raw))
# per record: what the fallbacks read
per = {}
for p, r in out:
    rel = str(p.relative_to(REPO))
    per[rel] = {"transfer": st.transfer_setting(r), "peer_data": st.peer_data_setting(r),
                "predictor": st.predictor_setting(r), "single_architecture": st.single_architecture(r),
                "headline": hl.headline_value(r), "basis": hl.headline_basis(r), "headline_of": st.headline_of(r)}
text = json.dumps({"made_by": "tests/golden/make_older_records.py at 38a633c", "n_records": len(out), "board": board,
                   "per_record": per}, indent=0, sort_keys=True)
Path(sys.argv[3]).write_text(text + "\n")
print(len(out), len(text))
