"""Running HtFLlib's own code from a checkout, for the benchmarks that compare against it.

``export`` writes the files HtFLlib's ``system/`` needs (``main.py``, ``flcore/``, ``utils/``) at one
commit of the checkout into a temporary folder, and links the data folder where HtFLlib reads it
(``dataset/<name>`` beside ``system/``); nothing of HtFLlib is copied into this repository and the
checkout itself is not modified. ``Driver`` runs ``htfllib_driver.py`` there as a subprocess, one
gated round at a time or to the end, and parses its ``HTFL_ROUND`` lines.

The default commit is 6e6f1ae (2025-09-01), the last before ca3e29a (2025-11-29), which changed FD's
distillation target from the softmax of the global class logits to the logits themselves; the
commits after it add only FedL2G.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "htfllib_driver.py"
DEFAULT_COMMIT = "6e6f1ae"
PARTS = ("system/main.py", "system/flcore", "system/utils")
DATASET = "mnist-htfl"  # the name HtFLlib's -data gets: ../dataset/<name>


def export(checkout: Path, data: Path, commit: str | None = DEFAULT_COMMIT) -> tuple[Path, str]:
    """A temporary folder holding HtFLlib's ``system/`` at ``commit`` (the files as they are when
    ``commit`` is None or the checkout is no git repository) and ``dataset/<DATASET>`` linked to
    ``data``. Returns the ``system/`` path and the commit used (its full hash, or 'worktree')."""
    checkout, data = Path(checkout).resolve(), Path(data).resolve()
    if not (checkout / "system" / "main.py").is_file():
        raise SystemExit(f"--htfllib {checkout}: no system/main.py there; point it at an HtFLlib checkout")
    if not (data / "config.json").is_file():
        raise SystemExit(f"--data {data}: no config.json there; point it at a PFLlib/HtFLlib folder")
    root = Path(tempfile.mkdtemp(prefix="htfllib-"))
    used = "worktree"
    is_git = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--git-dir"], capture_output=True).returncode == 0
    if commit and is_git:
        used = subprocess.run(["git", "-C", str(checkout), "rev-parse", commit], capture_output=True, text=True,
                              check=True).stdout.strip()
        archive = root / "parts.tar"
        with archive.open("wb") as out:  # stderr kept back: git may warn about unrelated missing blobs
            done = subprocess.run(["git", "-C", str(checkout), "archive", used, *PARTS], stdout=out,
                                  stderr=subprocess.PIPE, text=True)
        if done.returncode:
            raise SystemExit(f"git archive {used} failed in {checkout}: {done.stderr.strip()}")
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
        archive.unlink()
    else:
        for part in PARTS:
            src, dst = checkout / part, root / part
            dst.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    (root / "dataset").mkdir()
    (root / "dataset" / DATASET).symlink_to(data)
    return root / "system", used


# HtFLlib's FedAvgCNN for an image shape: (in_features, flattened size), as its main.py builds it
FEDAVGCNN = {(1, 28, 28): (1, 1024), (3, 32, 32): (3, 1600)}


def driver_command(algo: str, rounds: int, batch: int, epochs: int, lr: float, clients: int,
                   extra: list[str], seed: int = 0, gate: bool = False,
                   image_shape: tuple[int, ...] = (1, 28, 28)) -> list[str]:
    in_features, dim = FEDAVGCNN[tuple(image_shape)]
    cmd = [sys.executable, str(DRIVER), "-dev", "cpu", "-algo", algo, "-data", DATASET, "-ncl", "10",
           "-nc", str(clients), "-lbs", str(batch), "-ls", str(epochs), "-lr", str(lr), "-gr", str(rounds),
           "-fd", "512", "-jr", "1", "-eg", "1", "--seed", str(seed), "--in-features", str(in_features),
           "--dim", str(dim), *extra]
    return cmd + (["--gate"] if gate else [])


def parse(line: str) -> dict | None:
    head, _, body = line.partition(" ")
    return json.loads(body) if head == "HTFL_ROUND" else None


class Driver:
    """HtFLlib's driver as a subprocess in ``system``; ``log`` receives its own output."""

    def __init__(self, system: Path, cmd: list[str], log: Path, threads: int = 1):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        self.log = log.open("a")
        self.proc = subprocess.Popen(cmd + ["--threads", str(threads)], cwd=system, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, bufsize=1)
        self.setup = self._next()

    def _next(self) -> dict:
        for line in self.proc.stdout:
            self.log.write(line)
            rec = parse(line.rstrip("\n"))
            if rec is not None:
                return rec
        self.log.flush()
        raise RuntimeError(f"HtFLlib's driver ended (exit {self.proc.wait()}); its output is in {self.log.name}")

    def round(self) -> dict:
        """Let one gated round run and return its figures."""
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self._next()

    def rounds(self):
        """Every round of an ungated run, as it finishes."""
        while True:
            try:
                yield self._next()
            except RuntimeError:
                if self.proc.wait() == 0:
                    return
                raise

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the driver stops at its next round boundary
            try:
                self.proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
