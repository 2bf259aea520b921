"""Experiment trackers: TensorBoard, MLflow and Weights & Biases, as optional callbacks on the run
path (``hfl_bench.runpath``). Each is an extra (``pip install 'hfl-bench[tensorboard]'``, ``[mlflow]``,
``[wandb]``) and works offline:

- ``tensorboard``: event files under ``<out>/trackers/tensorboard/<record stem>/`` (``tensorboard
  --logdir``), with a copy of the record beside them; the points that arrive after a later
  round's (round 0, a round scored late) in the run ``<record stem>/late`` (``TensorBoard``).
- ``mlflow``: a run in the experiment ``hfl-bench`` (or ``$MLFLOW_EXPERIMENT_NAME``) at
  ``$MLFLOW_TRACKING_URI``, by default MLflow's file store ``<out>/trackers/mlruns`` (for which
  ``MLFLOW_ALLOW_FILE_STORE`` is set to true unless set already); the record is the run's artifact.
- ``wandb``: a run in the project ``hfl-bench`` (or ``$WANDB_PROJECT``), in ``$WANDB_MODE``, by
  default ``offline`` (files under ``<out>/trackers/wandb``; ``wandb sync`` uploads them); the
  record is an artifact of type ``record``.

The trackers' folder ``<out>/trackers`` holds copies of records (artifacts): the record walker
(``results.loading.record_files``) leaves it out, so ``leaderboard show <out>`` counts each run once.

Per round each logs, at step = the round, the round's figures of the record's history: the mean
global, local and validation accuracy (``global_acc`` is the headline's per-round figure), those of
each client group (``honest/global_acc`` ...), the bytes sent, and each client's figures where the
history holds them (``client/3/global_acc``, the final rounds). At the end: the record's summary
(headline, selected round and its figures, bytes per client per round, budget, wall time, status)
and the record file. Round 0 (the initial models: it reaches the trackers with the record) and a
test round the engine scores late (the selected round) are logged at the end, at their round. A
matrix's driver logs its local cells live (their rounds reach it as they end)
and replays a Ray cell's history when its record comes back (``matrix.runner``).

A tracker never enters the config hash, and never costs a run: any failure of a tracker (not
installed, a tracking server down, a full disk) is one warning and that tracker is dropped; the
run and its record go on. Its start is bounded in time (MLflow: one request of 5 s at most to an
http(s) server, then bounded retries, ``probe`` and ``bounded_http``), and a W&B run file that
W&B's own process could not write in full is found and warned (``_check_run_file``). A matrix
starts no later cell's tracker that failed to start (one warning for the matrix).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Optional

from hfl_bench.config import ConfigError
from hfl_bench.paths import TRACKER_FOLDER, trackers_folder

log = logging.getLogger(__name__)

TRACKERS = ("tensorboard", "mlflow", "wandb")
EXTRAS = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
GROUPS = ("honest", "faulty", "recipients", "donors")
FIGURES = ("global_acc", "local_acc", "mean_val_acc", "seen_acc", "unseen_acc")
EXPERIMENT = "hfl-bench"


def check_names(names: Iterable[str], where: str = "--tracker") -> list[str]:
    """The tracker names, each known and listed once (ConfigError, one line, otherwise)."""
    if isinstance(names, str):
        names = [names]
    out: list[str] = []
    for name in names:
        if not isinstance(name, str) or name not in TRACKERS:
            raise ConfigError(f"unknown tracker {name!r} in {where}: known are {', '.join(TRACKERS)}")
        if name not in out:
            out.append(name)
    return out


def round_values(entry: dict[str, Any]) -> dict[str, float]:
    """A history entry's figures as tracker metrics (module doc); None figures are left out."""
    values: dict[str, Any] = {k: entry.get(k) for k in FIGURES}
    for group in GROUPS:
        if isinstance(entry.get(group), dict):
            values.update({f"{group}/{k}": entry[group].get(k) for k in FIGURES})
    values["bytes"] = entry.get("bytes")
    for key in ("client_global_acc", "client_local_acc"):
        for cid, v in enumerate(entry.get(key) or []):
            values[f"client/{cid}/{key[len('client_'):]}"] = v
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def summary_values(record: dict[str, Any]) -> dict[str, float]:
    """A record's summary as tracker metrics: headline, selected round and figures, cost, budget."""
    from hfl_bench.results.figures import headline_value

    m = record.get("metrics") or {}
    cost = record.get("cost") or {}
    values: dict[str, Any] = {"headline_global_acc": headline_value(record),
                              "selected_round": (record.get("selection") or {}).get("round"),
                              **{f"selected_{k}": m.get(k) for k in ("global_acc", "local_acc", "mean_val_acc")},
                              "bytes_sent_per_client_per_round": cost.get("bytes_sent_per_client_per_round"),
                              "bytes_total": cost.get("bytes_total"),
                              "wall_time_total_s": cost.get("wall_time_total_s")}
    for c in m.get("per_client") or []:
        if isinstance(c, dict):
            values.update({f"selected_client/{c.get('cid')}/{k}": c.get(k) for k in ("global_acc", "local_acc")})
    values.update({f"budget/{k}": v for k, v in _flat(cost.get("budget") or {}).items()})
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix: node} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(_flat(v, f"{prefix}/{k}" if prefix else str(k)))
    return out


class Tracker:
    """One tracker of one run: ``start``, ``log`` per round, ``finish`` with the record."""

    name = ""

    def start(self, run: Any) -> None:
        raise NotImplementedError

    def log(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def finish(self, record: dict[str, Any], path: Optional[Path]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """End the tracker's run without a record (the run raised)."""


class TensorBoard(Tracker):
    """TensorBoard draws a run's points of a tag in the order they were written, so a point written
    after a later round's (round 0, which reaches the trackers with the record, or a selected round
    scored late) would be drawn after the last round: such points go to the run ``<stem>/late``
    instead, at their round, each tag's points in the run ``<stem>`` in round order."""

    name = "tensorboard"
    LATE = "late"

    def start(self, run: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = trackers_folder(run.cfg.out, "tensorboard") / run.record_path.stem
        self.writer = SummaryWriter(log_dir=str(self.folder))
        self.late = None
        self.steps: dict[str, int] = {}  # each tag's last step written to the run's own events
        self.writer.add_text("config", f"```\n{json.dumps(_config(run), indent=1)}\n```", 0)

    def log(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            if step > self.steps.get(k, -1):
                self.writer.add_scalar(k, v, step)
                self.steps[k] = step
            else:
                self._late().add_scalar(k, v, step)

    def _late(self):
        if self.late is None:
            from torch.utils.tensorboard import SummaryWriter

            self.late = SummaryWriter(log_dir=str(self.folder / self.LATE))
        return self.late

    def finish(self, record: dict[str, Any], path: Optional[Path]) -> None:
        step = int((record.get("federation") or {}).get("rounds_run") or 0)
        for k, v in summary_values(record).items():
            self.writer.add_scalar(f"summary/{k}", v, step)
        self.writer.add_text("status", str(record.get("status")), step)
        self.writer.flush()
        if self.late is not None:
            self.late.flush()
        if path is not None:  # TensorBoard has no artifacts: the record goes beside its events
            from hfl_bench.paths import write_atomic

            write_atomic(self.folder / "record.json", Path(path).read_bytes())
        self.close()

    def close(self) -> None:
        for name in ("writer", "late"):
            writer = getattr(self, name, None)
            if writer is not None:
                setattr(self, name, None)
                writer.close()


class MLflow(Tracker):
    name = "mlflow"

    def start(self, run: Any) -> None:
        import mlflow.tracking  # noqa: F401 - not installed: that, not the server, is the warning

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # offline: MLflow's file store, which MLflow 3 keeps behind a switch
            uri = trackers_folder(run.cfg.out, "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        probe(uri)
        with bounded_http():
            self._start(run, uri)

    def _start(self, run: Any, uri: str) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        cfg = run.cfg
        tags = {"hfl_bench.method": cfg.method, "hfl_bench.task": cfg.task, "hfl_bench.seed": str(cfg.seed),
                "hfl_bench.config_hash": run.config_hash}
        self.run_id = self.client.create_run(experiment_id, run_name=run.record_path.stem, tags=tags).info.run_id
        from mlflow.entities import Param

        params = [Param(k, v if isinstance(v, str) else json.dumps(v)) for k, v in _flat(_config(run)).items()]
        self.client.log_batch(self.run_id, params=params)

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values.items()]
        with bounded_http():
            self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, record: dict[str, Any], path: Optional[Path]) -> None:
        step = int((record.get("federation") or {}).get("rounds_run") or 0)
        self.log(step, {f"summary/{k}": v for k, v in summary_values(record).items()})
        with bounded_http():
            self.client.set_tag(self.run_id, "hfl_bench.status", str(record.get("status")))
            if path is not None:
                self.client.log_artifact(self.run_id, str(path))
            self.client.set_terminated(self.run_id, "FINISHED" if record.get("status") != "failed" else "FAILED")
        self.run_id = None

    def close(self) -> None:
        if getattr(self, "run_id", None) is not None:
            run_id, self.run_id = self.run_id, None
            with bounded_http():
                self.client.set_terminated(run_id, "KILLED")


# A tracking server that is down must not cost the run (module doc): MLflow's client retries each
# request 7 times with exponential backoff (about 4 minutes) and waits 120 s for an answer. Before a
# run's MLflow run starts, one request with a short timeout and no retry checks that an http(s)
# server answers; every request of the tracker then runs under these bounds (about half a minute at
# most, after which the tracker is dropped), each unless the user set it in the environment.
PROBE_TIMEOUT_S = 5.0
HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
_ENV_LOCK = threading.RLock()  # the bounds are process environment: one tracker call sets them at a time


def probe(uri: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise ConnectionError, at once, when the http(s) tracking server at ``uri`` does not answer
    within ``timeout`` seconds (any HTTP answer, even an error status, means it is up); other
    URIs (a file store, ``databricks``) are left to MLflow."""
    from urllib.parse import urlsplit

    if urlsplit(uri).scheme not in ("http", "https"):
        return
    import requests

    try:  # requests, as MLflow's client: the same proxies and certificates; no retry
        requests.get(uri.rstrip("/") + "/health", timeout=timeout, allow_redirects=False).close()
    except requests.RequestException as e:
        reason = "no answer" if isinstance(e, requests.Timeout) else _os_reason(e) or type(e).__name__
        raise ConnectionError(f"no tracking server answers at {uri} ({reason}; one request, "
                              f"{timeout:g} s at most)") from None


def _os_reason(e: Optional[BaseException]) -> Optional[str]:
    """The system's words for the OSError under ``e`` (``Connection refused``), if there is one:
    requests wraps it in urllib3's errors, two or three deep."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.strerror:
            return e.strerror
        e = e.__cause__ or e.__context__ or getattr(e, "reason", None)
    return None


@contextlib.contextmanager
def bounded_http():
    """MLflow's HTTP retries and timeout bounded (``HTTP_BOUNDS``) for the calls inside."""
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in HTTP_BOUNDS}
        os.environ.update({k: v for k, v in HTTP_BOUNDS.items() if saved[k] is None})
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)


class WandB(Tracker):
    name = "wandb"

    def start(self, run: Any) -> None:
        import wandb

        folder = Path(run.cfg.out) / TRACKER_FOLDER  # W&B adds its own wandb/ folder
        folder.mkdir(parents=True, exist_ok=True)
        mode = os.environ.get("WANDB_MODE") or "offline"
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or EXPERIMENT, name=run.record_path.stem,
                              dir=str(folder), mode=mode, config=_config(run), reinit="create_new",
                              tags=[run.cfg.method, run.cfg.task], settings=wandb.Settings(silent=True,
                                                                                          console="off"))
        self.run.define_metric("round")
        self.run.define_metric("*", step_metric="round")
        self.stem = run.record_path.stem

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log({"round": step, **values})

    def finish(self, record: dict[str, Any], path: Optional[Path]) -> None:
        import wandb

        history = [e for e in record.get("history") or [] if isinstance(e, dict)]
        if history:  # the run's last round, not the last logged (a round scored late is logged last)
            self.run.summary.update({"round": history[-1].get("round"), **round_values(history[-1])})
        self.run.summary.update({f"summary/{k}": v for k, v in summary_values(record).items()})
        self.run.summary["status"] = str(record.get("status"))
        if path is not None:
            artifact = wandb.Artifact(_artifact_name(self.stem), type="record")
            artifact.add_file(str(path))
            self.run.log_artifact(artifact)
        run, self.run = self.run, None
        run.finish(exit_code=0 if record.get("status") != "failed" else 1)
        _check_run_file(run)

    def close(self) -> None:
        if getattr(self, "run", None) is not None:
            run, self.run = self.run, None
            run.finish(exit_code=1)


def _artifact_name(stem: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in stem)


WANDB_STILL_S = 10.0  # how long W&B's run file may stay unchanged, and without its end, before it is cut


def _check_run_file(run: Any, still_s: float = WANDB_STILL_S) -> None:
    """Raise OSError when W&B's run file (``run-<id>.wandb``, what ``wandb sync`` uploads) does not
    come to hold the run's exit record, its last. W&B writes it in a process of its own, which drops
    a write that fails (a full disk) without a word, and ``finish`` returns as if all were kept, and
    before that process has written the end (milliseconds later): the file is read until the end
    is there, or it has not grown for ``still_s`` seconds."""
    settings = run.settings
    if getattr(settings, "mode", None) == "disabled":
        return
    path = Path(settings.sync_file)
    size, kinds, changed = -1, [], time.monotonic()
    while "exit" not in kinds and time.monotonic() - changed < still_s:
        try:
            now = path.stat().st_size
            if now != size:
                size, kinds, changed = now, _record_kinds(path.read_bytes()), time.monotonic()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise OSError(f"W&B's run file {path} cannot be read back ({e.strerror or e})") from None
        if "exit" not in kinds:
            time.sleep(0.05)
    if "exit" not in kinds:
        raise OSError(f"W&B's run file {path} is cut after {max(size, 0)} bytes ({len(kinds)} records, "
                      "not the run's end): were its writes refused (a full disk)?")


def _record_kinds(data: bytes) -> list[str]:
    """The kinds of the records in a W&B run file, up to the first that is cut or damaged: W&B's
    protobuf ``Record``s in LevelDB's log framing (a 7-byte W&B header; 32 KiB blocks of chunks,
    each with a 7-byte header: checksum, length, full / first / middle / last)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    block, pos, pending, kinds = 32768, 7, b"", []
    if data[:4] != b":W&B":
        return kinds
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's trailer
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind not in (1, 2, 3, 4) or pos + 7 + length > len(data):
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(pending)
            except Exception:  # noqa: BLE001 - a damaged record: the file ends here
                break
            kinds.append(record.WhichOneof("record_type") or "")
    return kinds


CLASSES = {"tensorboard": TensorBoard, "mlflow": MLflow, "wandb": WandB}


def _config(run: Any) -> dict[str, Any]:
    """The run's config as a record stores it (no machine paths), with its hash."""
    import dataclasses

    from hfl_bench.paths import portable_config

    return {**portable_config(dataclasses.asdict(run.cfg)), "config_hash": run.config_hash}


class Trackers:
    """The trackers of one run. Every call is guarded: a tracker that raises is one warning and is
    dropped; the run goes on. ``round`` takes the history entries as the engine reports them;
    ``finish`` logs what the record holds that was not logged live (a late-scored round), then the
    summary and the record file. ``failed`` names the trackers whose start failed: ``in_matrix``,
    the matrix starts them for no later cell, and their warning says so."""

    def __init__(self, names: Iterable[str] = (), in_matrix: bool = False):
        self.names = check_names(names)
        self.in_matrix = in_matrix
        self.active: list[Tracker] = []
        self.logged: dict[int, dict[str, float]] = {}
        self.failed: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.names)

    def _guard(self, tracker: Tracker, what: str, call, goes_on: str = "the run") -> bool:
        try:
            call()
            return True
        except Exception as e:  # noqa: BLE001 - a tracker never costs the run (module doc)
            first = (str(e).strip().splitlines() or [""])[0][:300]
            hint = (f" (pip install 'hfl-bench[{EXTRAS[tracker.name]}]')" if isinstance(e, ImportError) else "")
            log.warning("tracker %s: %s failed (%s: %s)%s; %s goes on without it", tracker.name, what,
                        type(e).__name__, first, hint, goes_on)
            if tracker in self.active:
                self.active.remove(tracker)
                try:
                    tracker.close()
                except Exception:  # noqa: BLE001
                    pass
            return False

    def start(self, run: Any) -> None:
        self.active, self.logged, self.failed = [], {}, []
        for name in self.names:
            tracker = CLASSES[name]()
            self.active.append(tracker)
            goes_on = "the matrix" if self.in_matrix else "the run"
            if not self._guard(tracker, "start", lambda t=tracker: t.start(run), goes_on):
                self.failed.append(name)

    def round(self, entry: dict[str, Any]) -> None:
        rnd = entry.get("round")
        if not isinstance(rnd, int):
            return
        values = round_values(entry)
        self.logged[rnd] = values
        for tracker in list(self.active):
            self._guard(tracker, f"logging round {rnd}", lambda t=tracker: t.log(rnd, values))

    def finish(self, record: dict[str, Any], path: Optional[Path]) -> None:
        for entry in record.get("history") or []:  # rounds scored late, or never seen (a Ray cell)
            if isinstance(entry, dict) and isinstance(entry.get("round"), int):
                values = round_values(entry)
                seen = self.logged.get(entry["round"], {})
                late = {k: v for k, v in values.items() if seen.get(k) != v}
                if late:
                    self.logged[entry["round"]] = {**seen, **late}
                    for tracker in list(self.active):
                        self._guard(tracker, f"logging round {entry['round']}",
                                    lambda t=tracker, e=entry, lv=late: t.log(e["round"], lv))
        for tracker in list(self.active):
            self._guard(tracker, "logging the record", lambda t=tracker: t.finish(record, path))
        self.active = []

    def close(self) -> None:
        """End every tracker's run without a record (the run raised or was interrupted)."""
        for tracker in list(self.active):
            self._guard(tracker, "closing", tracker.close)
        self.active = []
