"""Image files in the common class-per-subfolder layout, read offline: ``imagefolder`` (any such
folder), ``cifar10-jpg`` (CIFAR-10 as JPEG files, subsampled) and ``cifar10-jpg-full`` (the same
files, every training image).

Layout: ``<root>/train/<class>/<image>`` and ``<root>/test/<class>/<image>``, images ending in
.jpg, .jpeg or .png (any case). The classes are the sorted names of train/'s subfolders and test/
must have the same ones. Images in subfolders of a class folder, at any depth, belong to that class
(as torchvision's ImageFolder reads them), in path order. Names starting with "." are skipped
(``.DS_Store``, macOS's ``._x.jpg`` resource files, editor checkpoints). Symbolic links are
followed; a loop (a link back to a folder that holds it, or one that never resolves) and a link to
nothing named like an image are refused naming the link.

Images are decoded once with PIL (converted to RGB, optionally resized, optionally subsampled) and
the result is kept in a cache file named after the data fingerprint, so a later load only reads
that file. 16-bit PNGs are scaled to 8 bits (0..65535 to 0..255; PIL's own conversion clips grey
ones to white); a pixel mode that cannot be scaled (floats) is refused. Before decoding, the memory
the decoded set needs while loading is estimated from the first image and the count, and a set that
does not fit in the available memory is refused with the hint to set ``image_size`` (or subsample).
The fingerprint (``hfl_bench.data``) covers every image file of train/ and test/ plus the
decoding settings (image size, subsamples and their seed): a changed file or setting is other
data, with a new cache file. Cache folder: ``<root>/.hfl-bench-cache/`` when the root is writable,
else ``$HFL_BENCH_CACHE``, else ``~/.cache/hfl-bench/imagefolder/``.

``imagefolder`` learns its number of classes and image shape from the folder: its registered
``info`` leaves them unknown (None and ()), and ``load`` sets the loaded instance's ``info`` (which
the engine reads after loading) from the folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import ClassVar

import numpy as np

from hfl_bench.data import FINGERPRINT_CHARS, DatasetError, Task, TaskData, TaskInfo, files_fingerprint, register_task
from hfl_bench.npzfile import ArraySpec, UnusableFile, read_arrays
from hfl_bench.paths import write_atomic
from hfl_bench.tasks.cifar import CITATION as CIFAR_CITATION
from hfl_bench.tasks.cifar import LICENSE as CIFAR_LICENSE

log = logging.getLogger(__name__)

SPLITS = ("train", "test")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
CACHE_FOLDER = ".hfl-bench-cache"
CACHE_ENV = "HFL_BENCH_CACHE"
CACHE_FORMAT = 1  # bump when the cache file's layout changes (old files are then rebuilt)
ARRAY_KEYS = ("train_x", "train_y", "test_x", "test_y")
# Bytes per decoded value at the peak of a load: the uint8 arrays, their float32 copy in [0, 1]
# (``_unit_range``) and the normalized float32 tensors ``Task.load`` makes from it.
LOAD_BYTES_PER_VALUE = 1 + 4 + 4
# Pixel modes PIL converts to RGB without loss of scale (8 bits a channel); 16-bit grey is scaled here.
EIGHT_BIT_MODES = {"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"}
SIXTEEN_BIT_GREY = {"I;16", "I;16B", "I;16L", "I;16N", "I"}  # "I": older PIL's 16-bit grey PNG
# Pixels an image may declare in its header, checked before decoding: PIL's own default limit, at which
# it only warns (it refuses at twice as many); one decoded RGB image then takes at most ~256 MiB.
MAX_PIXELS = 89_478_485
TOO_LARGE_HINT = ("set image_size on the task (a subclass of ImageFolderTask) to decode them smaller, or "
                  "train_subsample / test_subsample to decode fewer")

Split = tuple[list[Path], np.ndarray]  # image files and their labels


class ImageFolderTask(Task):
    """Base class of a task that reads ``<root>/{train,test}/<class>/<image>`` (module docstring).
    A variant sets the class attributes below and its ``info``; ``info.num_classes = None`` means
    the classes (and image shape) come from the folder."""

    folder_name: ClassVar[str] = ""  # the root's subfolder of the data dir; "" = the data dir itself
    image_size: ClassVar[int | None] = None  # resize to size x size (bilinear); None = keep, all equal
    train_subsample: ClassVar[int | None] = None  # training images kept, stratified; None = all
    test_subsample: ClassVar[int | None] = None
    subsample_seed: ClassVar[int] = 0

    _class_names: list[str] | None = None

    # ----------------------------------------------------------------------- the Task interface

    def data_files(self, data_dir: Path) -> list[Path]:
        """Every image file of train/ and test/ (all of them, subsampled or not)."""
        _, splits = self._scan(data_dir)
        return [path for files, _ in splits.values() for path in files]

    def fingerprint(self, data_dir: Path | str | None = None) -> str:
        return self._with_settings(super().fingerprint(data_dir))

    def load(self, data_dir: Path | str | None = None, download: bool = False) -> TaskData:
        try:
            data = super().load(data_dir, download)
        except MemoryError:  # normalizing copies the decoded set: the estimate left no room
            raise DatasetError(f"{self.info.name}: not enough memory to load the decoded images; "
                               f"{TOO_LARGE_HINT}") from None
        return dataclasses.replace(data, fingerprint=self._with_settings(data.fingerprint))

    def load_arrays(self, data_dir: Path, download: bool):
        root = self.root(data_dir)
        if download:
            raise DatasetError(f"{self.info.name} reads a local folder only ({root}): --download is not "
                               "supported; run without it")
        classes, splits = self._scan(data_dir)
        # The same hash Task.load computes after us: the content hashes are cached by then, so it
        # costs stat calls only.
        key = self._with_settings(files_fingerprint(self.info, [p for files, _ in splits.values() for p in files]))
        arrays = read_cache(key, classes, root, self.info.name, self._cache_specs(classes, splits))
        if arrays is None:
            arrays = self._decode(splits)
            write_cache(key, arrays, classes, root, self.info.name)
        self._adopt_folder(root, classes, tuple(arrays["train_x"].shape[1:]))
        # Task.load then normalizes per channel like every task
        return tuple(_unit_range(arrays[k]) if k.endswith("_x") else arrays[k] for k in ARRAY_KEYS)

    def class_names(self) -> list[str] | None:
        return self._class_names

    # ----------------------------------------------------------------------- the folder

    def root(self, data_dir: Path) -> Path:
        return data_dir / self.folder_name if self.folder_name else data_dir

    def missing_hint(self, data_dir: Path) -> str:
        """What to do when the folder is not there (one sentence)."""
        return "point --data-dir at a folder holding train/<class>/ and test/<class>/ with .jpg or .png images"

    def _scan(self, data_dir: Path) -> tuple[list[str], dict[str, Split]]:
        """The class names, and each split's image files (in class, then name order) and labels.
        DatasetError (one line) for anything that does not match the layout."""
        name, root = self.info.name, self.root(data_dir)
        if not (root / "train").is_dir() or not (root / "test").is_dir():
            raise DatasetError(f"{name}: no image folder at {root} (it needs train/ and test/); "
                               f"{self.missing_hint(data_dir)}")
        classes = _subfolders(root / "train", name)
        if len(classes) < 2:
            raise DatasetError(f"{name}: {root / 'train'} holds {len(classes)} class folders; a task needs at least 2 "
                               "(train/<class>/<image>)")
        test_classes = _subfolders(root / "test", name)
        if test_classes != classes:
            missing, extra = sorted(set(classes) - set(test_classes)), sorted(set(test_classes) - set(classes))
            raise DatasetError(f"{name}: {root / 'test'} must hold the same class folders as train/: "
                               f"missing {missing or 'none'}, extra {extra or 'none'}")
        return classes, {split: _split_files(root / split, classes, name) for split in SPLITS}

    def _cache_specs(self, classes: list[str], splits: dict[str, Split]) -> dict[str, ArraySpec]:
        """The cache file's decompression budget (hfl_bench.npzfile): each split's number of kept
        images, at image_size when set, else of any size within MAX_PIXELS an image and the memory
        a load may take (as ``_check_memory`` allows for decoding); no image is opened for it."""
        size, have = self.image_size, available_memory()
        specs = {"format": ArraySpec("iu", None),
                 "classes": ArraySpec("U", (), len(classes), 4 * max(len(c) for c in classes))}
        for split, keep in (("train", self.train_subsample), ("test", self.test_subsample)):
            n = len(splits[split][0]) if keep is None else min(keep, len(splits[split][0]))
            cap = n * 3 * (MAX_PIXELS if size is None else size * size)
            if have is not None:
                cap = min(cap, have // LOAD_BYTES_PER_VALUE)
            specs[f"{split}_x"] = ArraySpec("u", (3, size, size), n, 1, max_bytes=cap)
            specs[f"{split}_y"] = ArraySpec("i", (), n)
        return specs

    # ----------------------------------------------------------------------- decoding

    def _decode(self, splits: dict[str, Split]) -> dict[str, np.ndarray]:
        """Subsample, then decode the kept images: uint8 N x 3 x H x W and int64 labels. The first
        image tells the size: a set too large for the memory available is refused before the rest."""
        kept: dict[str, Split] = {}
        for i, (split, keep) in enumerate((("train", self.train_subsample), ("test", self.test_subsample))):
            files, labels = splits[split]
            if keep is not None and keep < len(files):
                picked = stratified_pick(labels, keep, (self.subsample_seed, i))
                files, labels = [files[j] for j in picked], labels[picked]
            kept[split] = files, labels
        total = sum(len(files) for files, _ in kept.values())
        out: dict[str, np.ndarray] = {}
        first = None  # (path, shape) of the first image decoded: without image_size, all must match it
        for split, (files, labels) in kept.items():
            x = None
            for j, path in enumerate(files):
                a = self._decode_file(path)
                if first is None:
                    first = (path, a.shape)
                    self._check_memory(total, a.shape)
                if a.shape != first[1]:
                    raise DatasetError(f"{self.info.name}: images differ in size: {first[0]} is {_size(first[1])}, "
                                       f"{path} is {_size(a.shape)}; set image_size on the task (a subclass of "
                                       "ImageFolderTask) to resize them")
                if x is None:
                    x = self._allocate(len(files), a.shape)
                x[j] = a
            out[f"{split}_x"], out[f"{split}_y"] = x, labels
        return out

    def _check_memory(self, n_images: int, shape: tuple[int, ...]) -> None:
        need = n_images * int(np.prod(shape)) * LOAD_BYTES_PER_VALUE
        have = available_memory()
        if have is not None and need > have:
            raise DatasetError(f"{self.info.name}: {n_images:,} images of {_size(shape)} need about {_bytes(need)} of "
                               f"memory to load, {_bytes(have)} is available; {TOO_LARGE_HINT}")

    def _allocate(self, n_images: int, shape: tuple[int, ...]) -> np.ndarray:
        try:
            return _allocate(n_images, shape)
        except MemoryError:
            raise DatasetError(f"{self.info.name}: not enough memory for {n_images:,} decoded images of "
                               f"{_size(shape)}; {TOO_LARGE_HINT}") from None

    def _decode_file(self, path: Path) -> np.ndarray:
        """One image as uint8 3 x H x W: RGB, 16-bit scaled to 8, resized to image_size if set."""
        from PIL import Image

        size = self.image_size
        try:
            with Image.open(path) as image:  # reads the header only: the size is known before decoding
                if image.width * image.height > MAX_PIXELS:
                    raise DatasetError(f"{self.info.name}: image {path} declares {image.width}x{image.height} pixels, "
                                       f"over the budget of {MAX_PIXELS:,} pixels an image; refused before decoding "
                                       "it: replace it with a smaller copy")
                image = _eight_bit(image)
                image = image.convert("RGB")  # grey and palette PNGs get 3 channels, alpha is dropped
                if size is not None and image.size != (size, size):
                    image = image.resize((size, size), Image.Resampling.BILINEAR)
                return np.asarray(image).transpose(2, 0, 1)
        except DatasetError:
            raise
        except MemoryError:
            raise DatasetError(f"{self.info.name}: image {path} is too large to decode in the memory available; "
                               "replace it with a smaller copy") from None
        except _UnsupportedMode as e:
            raise DatasetError(f"{self.info.name}: cannot read image {path}: {e}; convert it to 8- or 16-bit "
                               "grey, RGB or palette") from None
        except Exception as e:  # noqa: BLE001 - untrusted bytes fail in many ways: all are a bad file
            detail = " ".join(str(e).split())
            raise DatasetError(f"{self.info.name}: cannot read image {path} ({type(e).__name__}: {detail}); "
                               "remove or replace the file") from None

    # ----------------------------------------------------------------------- settings and metadata

    def _settings(self) -> dict[str, int | None]:
        return {"image_size": self.image_size, "train_subsample": self.train_subsample,
                "test_subsample": self.test_subsample, "subsample_seed": self.subsample_seed}

    def _with_settings(self, files_fp: str | None) -> str:
        """The data fingerprint: the files' fingerprint and the decoding settings (other settings
        yield other arrays from the same files)."""
        text = json.dumps([files_fp, self._settings()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_CHARS]

    def _adopt_folder(self, root: Path, classes: list[str], shape: tuple[int, ...]) -> None:
        """Set a folder-defined task's number of classes and input shape from the folder; check a
        fixed task's number of classes against it (Task.load checks the shape)."""
        self._class_names = classes
        info, n = type(self).info, len(classes)
        if info.num_classes is None:
            self.info = dataclasses.replace(info, num_classes=n, input_shape=shape)
        elif n != info.num_classes:
            raise DatasetError(f"{info.name}: {root / 'train'} holds {n} class folders, expected {info.num_classes}")


def _subfolders(folder: Path, task: str) -> list[str]:
    return [e.name for e, is_dir in _entries(folder, task) if is_dir]


def _entries(folder: Path, task: str) -> list[tuple[os.DirEntry, bool]]:
    """The folder's entries not named ".*", by name, each with whether it is a folder (links
    followed); DatasetError naming a link that never resolves (a loop) or a folder that cannot be read."""
    try:
        with os.scandir(folder) as it:
            entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError as e:
        raise DatasetError(f"{task}: cannot read folder {folder} ({_reason(e)})") from None
    try:  # scandir's is_dir reads the directory entry: no stat call per image, except links
        return [(e, e.is_dir()) for e in entries]
    except OSError as error:  # ELOOP: a link to itself, or around a circle of links
        bad = next(e for e in entries if _unresolvable(e))
        raise DatasetError(f"{task}: {folder / bad.name} is a symbolic link loop ({_reason(error)}); "
                           "remove or fix the link") from None


def _unresolvable(entry: os.DirEntry) -> bool:
    try:
        entry.is_dir()
        return False
    except OSError:
        return True


def _images(class_folder: Path, task: str) -> list[Path]:
    """The image files under a class folder at any depth, in path order (a folder's files and
    subfolders by name, a subfolder's images in its place). A link to a folder that holds it (a
    loop) and a link named like an image that leads to nothing are refused naming the link."""
    found: list[Path] = []
    walk = [(iter(_entries(class_folder, task)), class_folder, {_folder_id(class_folder, task)})]
    while walk:
        entries, folder, above = walk[-1]
        for e, is_dir in entries:
            if is_dir:
                path = folder / e.name
                here = _folder_id(path, task)
                if here in above:
                    raise DatasetError(f"{task}: {path} is a symbolic link loop (it leads back to a folder "
                                       "that holds it); remove the link")
                walk.append((iter(_entries(path, task)), path, above | {here}))
                break  # into the subfolder; this folder's entries go on after it
            if e.name.lower().endswith(IMAGE_SUFFIXES):
                if not e.is_file():
                    what = "a symbolic link to nothing" if e.is_symlink() else "not a file"
                    raise DatasetError(f"{task}: {folder / e.name} is {what}; remove it or put the image there")
                found.append(folder / e.name)
        else:
            walk.pop()
    return found


def _folder_id(folder: Path, task: str) -> tuple[int, int]:
    try:
        st = os.stat(folder)
    except OSError as e:
        raise DatasetError(f"{task}: cannot read folder {folder} ({_reason(e)})") from None
    return st.st_dev, st.st_ino


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _split_files(folder: Path, classes: list[str], task: str) -> Split:
    per_class = [_images(folder / c, task) for c in classes]
    if not any(per_class):
        raise DatasetError(f"{task}: no .jpg, .jpeg or .png images under {folder}/<class>/")
    for c, files in zip(classes, per_class):
        if not files:
            raise DatasetError(f"{task}: class folder {folder / c} holds no .jpg, .jpeg or .png images")
    labels = np.concatenate([np.full(len(files), i, np.int64) for i, files in enumerate(per_class)])
    return [p for files in per_class for p in files], labels


class _UnsupportedMode(ValueError):
    pass


def _eight_bit(image):
    """``image`` with 8 bits a channel: 16-bit grey (PIL mode I;16 or I) scaled from 0..65535 to
    0..255, rounded (PIL's convert would clip it at 255: a white image); 8-bit modes as they are
    (PIL reads 16-bit RGB PNGs as 8-bit RGB itself); anything else refused."""
    from PIL import Image

    if image.mode in EIGHT_BIT_MODES:
        return image
    if image.mode in SIXTEEN_BIT_GREY:
        a = np.asarray(image)
        if a.size and (a.min() < 0 or a.max() > 65535):
            raise _UnsupportedMode(f"pixel mode {image.mode} with values beyond 16 bits")
        return Image.fromarray(np.rint(a / 257.0).astype(np.uint8), "L")
    raise _UnsupportedMode(f"pixel mode {image.mode} cannot be scaled to 8 bits")


def _allocate(n_images: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.empty((n_images, *shape), np.uint8)


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation without swapping (psutil), or None if unknown."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - an estimate only: without it, decoding just tries
        return None


def _bytes(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


def _unit_range(x: np.ndarray) -> np.ndarray:
    """uint8 images as float32 in [0, 1], scaled in place (one copy of the decoded set, not two)."""
    out = x.astype(np.float32)
    out /= 255
    return out


def _size(shape: tuple[int, ...]) -> str:
    return f"{shape[2]}x{shape[1]}"  # width x height, as image viewers say it


def stratified_pick(labels: np.ndarray, total: int, seed) -> np.ndarray:
    """Sorted indices of ``total`` items: each class gets its proportional share, rounded down, and
    the items still missing go to the largest remainders (ties to the lower class), so the total is
    exact; the members of each class are drawn with ``seed``."""
    classes, counts = np.unique(labels, return_counts=True)
    share, remainder = np.divmod(counts * total, counts.sum())  # integers: no float rounding
    share[np.argsort(-remainder, kind="stable")[: total - share.sum()]] += 1
    rng = np.random.default_rng(seed)
    picked = [rng.choice(np.flatnonzero(labels == c), size=k, replace=False) for c, k in zip(classes, share)]
    return np.sort(np.concatenate(picked))


# --------------------------------------------------------------------------- the decoded-array cache


def cache_folders(root: Path) -> list[Path]:
    """Where a cache file may live, in order of preference (module docstring)."""
    folders = [root / CACHE_FOLDER]
    if os.environ.get(CACHE_ENV):
        folders.append(Path(os.environ[CACHE_ENV]).expanduser())
    return folders + [Path.home() / ".cache" / "hfl-bench" / "imagefolder"]


def read_cache(key: str, classes: list[str], root: Path, task: str,
               specs: dict[str, ArraySpec]) -> dict[str, np.ndarray] | None:
    """The cached arrays of this data, or None: a missing, unreadable or inconsistent cache file,
    or one over ``specs`` (its decompression budget), is ignored (and rewritten after decoding)."""
    for folder in cache_folders(root):
        try:
            z = read_arrays(folder / f"{task}-{key}.npz", specs, task)
            if int(z["format"]) != CACHE_FORMAT or z["classes"].tolist() != classes:
                continue
            arrays = {k: z[k] for k in ARRAY_KEYS}
        except UnusableFile as e:  # a FIFO, a link to a device, a huge file: never waited on or read
            log.warning("warning: the decode cache cannot be used (%s); the images are decoded again", e)
            continue
        except Exception:  # noqa: BLE001 - absent, truncated, garbage or over budget: decode again
            continue
        train_x, test_x = arrays["train_x"], arrays["test_x"]
        if (train_x.dtype == test_x.dtype == np.uint8 and train_x.ndim == 4 and train_x.shape[1] == 3
                and train_x.shape[1:] == test_x.shape[1:] and len(train_x) == len(arrays["train_y"])
                and len(test_x) == len(arrays["test_y"])):
            return arrays
    return None


def write_cache(key: str, arrays: dict[str, np.ndarray], classes: list[str], root: Path, task: str) -> None:
    """Best effort, atomically, into the first cache folder that takes it."""
    for folder in cache_folders(root):
        try:
            # A folder marked read-only is left alone, even by root (as the fingerprint cache does).
            if folder == root / CACHE_FOLDER and not root.stat().st_mode & 0o222:
                continue
            write_atomic(folder / f"{task}-{key}.npz",
                         lambda f: np.savez(f, format=CACHE_FORMAT, classes=np.array(classes), **arrays))
            return
        except OSError:
            continue


# --------------------------------------------------------------------------- the tasks


@register_task("imagefolder")
class ImageFolder(ImageFolderTask):
    """Your own images: --data-dir holds train/<class>/ and test/<class>/ (.jpg, .jpeg or .png files)."""

    info = TaskInfo(
        name="imagefolder",
        # 1.1: images in subfolders of a class folder are read, 16-bit PNGs scaled (1.0 skipped the
        # first and decoded 16-bit grey as white); the version is in the fingerprint, so no 1.0 cache is reused.
        version="1.1",
        num_classes=None,  # from the folder, when it is loaded
        input_shape=(),
        source="a local folder in the class-per-subfolder layout (--data-dir): train/<class>/, test/<class>/",
        citation="the folder's own",
        license="the folder's own",
        description=(
            "Any folder of .jpg/.jpeg/.png images, one subfolder per class, as train/ and test/ (the sorted "
            "names are the classes). All images, at their native size (they must share one); RGB. Classes and "
            "input shape are set from the folder when it is loaded. Decoded once into a cache file."
        ),
        augmentation="none",  # flips or crops could change the meaning of unknown images
        defaults={"pool": "cpu", "rounds": 100, "clients": 10, "partition": "dirichlet", "alpha": 0.3},
    )


@register_task("cifar10-jpg")
class CIFAR10JPG(ImageFolderTask):
    """CIFAR-10 from JPEG files (``hfl-bench prepare cifar10-jpg`` builds them from the python release;
    the committed records used the project's mirror archive, cifar10-jpg.tar.gz), a CPU-sized subsample."""

    folder_name = "cifar10-jpg"
    image_size = 32
    # CPU-sized training and test sets, stratified and seeded; bump info.version whenever they change.
    # The test subsample keeps the per-round global test affordable on a CPU (every client's model
    # on every test image each evaluated round): 2,000 images, 200 a class.
    train_subsample = 10_000
    test_subsample = 2_000

    info = TaskInfo(
        name="cifar10-jpg",
        version="1.0",
        num_classes=10,
        input_shape=(3, 32, 32),
        source="CIFAR-10 (https://www.cs.toronto.edu/~kriz/cifar.html) re-encoded as JPEG files by a public "
               "mirror: cifar10-jpg.tar.gz, unpacked to <data-dir>/cifar10-jpg/{train,test}/<class>/<nnnn>.jpg",
        citation=CIFAR_CITATION,
        license=CIFAR_LICENSE,
        description=(
            "The JPEG re-encoding of CIFAR-10 from a public mirror (pixel values differ slightly from the "
            f"pickled release): a stratified, seeded subsample of {train_subsample:,} of the 50,000 training "
            f"images and of {test_subsample:,} of the 10,000 test images. Offline; expects <data-dir>/cifar10-jpg."
        ),
        augmentation="crop-flip",
        # Calibrated on `local` alone (benchmarks/calibrate.py, README Protocol): 20 SGD steps per
        # client per round (median); local converges by round 29 of the 60-round study.
        defaults={"pool": "cpu", "rounds": 50, "clients": 10, "partition": "dirichlet", "alpha": 0.3,
                  "batch_size": 32, "lr": 0.01, "local_epochs": 1, "heldout_fraction": 0.2},
    )

    def missing_hint(self, data_dir: Path) -> str:
        return (f"build it from CIFAR-10's python release (cifar-10-python.tar.gz, or torchvision's "
                f"cifar-10-batches-py): hfl-bench prepare cifar10-jpg --from PATH --data-dir {data_dir}; or unpack "
                f"the project's mirror archive there (tar -xzf cifar10-jpg.tar.gz -C {data_dir}); or point "
                "--data-dir at the folder that holds cifar10-jpg/")


@register_task("cifar10-jpg-full")
class CIFAR10JPGFull(CIFAR10JPG):
    """All 50,000 CIFAR-10 training JPEGs (the same folder as ``cifar10-jpg``), for federations
    whose clients need more than the 10,000-image subsample gives (issue 67: N = 20 to 100)."""

    train_subsample = None  # every training image
    # test_subsample stays cifar10-jpg's 2,000 (stratified, the same seed): every evaluated round
    # tests every client's model on the global test set, and on a CPU 10,000 images at N = 100
    # would cost more than the round's training.

    info = TaskInfo(
        name="cifar10-jpg-full",
        version="1.0",
        num_classes=10,
        input_shape=(3, 32, 32),
        source=CIFAR10JPG.info.source,
        citation=CIFAR_CITATION,
        license=CIFAR_LICENSE,
        description=(
            "cifar10-jpg's JPEG files with all 50,000 training images (no training subsample) and the same "
            f"stratified, seeded subsample of {CIFAR10JPG.test_subsample:,} of the 10,000 test images, which keeps "
            "each test round affordable on a CPU. Offline; expects <data-dir>/cifar10-jpg."
        ),
        augmentation="crop-flip",
        # cifar10-jpg's CPU protocol at 20 clients, 10 a round (the CRAD paper's Table 3 shape).
        # rounds: calibrated on `local` alone at N = 20, 10 active (benchmarks/calibrate.py, 180
        # study rounds): rule 3b's plateau at round 80, so 1.5 x 80 = 120.
        defaults={"pool": "cpu", "rounds": 120, "clients": 20, "clients_per_round": 10, "partition": "dirichlet",
                  "alpha": 0.3, "batch_size": 32, "lr": 0.01, "local_epochs": 1, "heldout_fraction": 0.2},
    )
