"""Odd and hostile image folders: 16-bit PNGs decode at their real scale, images in subfolders of
a class folder are loaded, an image rewritten with the same size and timestamp is new data,
symbolic link loops and images too large for memory are refused in one line (exit 2 through the
CLI), never a traceback or a silent wrong answer."""

from __future__ import annotations

import os
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from hfl_bench.data import DatasetError, get_task
from hfl_bench.tasks import imagefolder

from helpers import invoke_cli
from test_imagefolder import CLASSES, first_pixels, write_folder, write_image

Image = pytest.importorskip("PIL.Image")


def png16(path: Path, values: np.ndarray) -> None:
    """A 16-bit PNG written byte by byte (PIL writes 16-bit grey only): grey for an H x W array,
    RGB for H x W x 3."""
    h, w = values.shape[:2]
    colour = 0 if values.ndim == 2 else 2
    rows = b"".join(b"\x00" + values[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, colour, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def one_line_error(task, root: Path) -> str:
    with pytest.raises(DatasetError) as e:
        task.load(root)
    message = str(e.value)
    assert "\n" not in message and len(message) < 500, message
    return message


def cli_error(root: Path, tmp_path: Path) -> str:
    """The one line ``hfl-bench run`` prints for this folder (exit 2, no traceback, no record)."""
    out = tmp_path / "out"
    result, stdout, stderr = invoke_cli("run", "--method", "local", "--task", "imagefolder", "--data-dir", str(root),
                                        "--rounds", "1", "--clients", "2", "-q", "--out", str(out))
    lines = [line for line in (stdout + stderr).splitlines() if line.strip()]
    assert result.exit_code == 2, (result.exception, lines)
    assert "Traceback" not in stdout + stderr and len(lines) == 1, lines
    assert not out.exists() or not list(out.glob("*.json"))
    return lines[0]


# --------------------------------------------------------------------------- 16-bit PNGs


def test_16_bit_grey_pngs_keep_their_scale(tmp_path):
    # 16-bit grey PNGs: k * 257 is k on the 8-bit scale; before, every pixel above 255 became 255
    for split, n in (("train", 3), ("test", 1)):
        for c, name in enumerate(CLASSES):
            for i in range(n):
                level = 40 * c + 10 * i + 5
                (tmp_path / split / name).mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.full((4, 4), level * 257, np.uint16)).save(tmp_path / split / name / f"{i}.png")
    with Image.open(tmp_path / "train" / "cat" / "0.png") as image:
        assert image.mode.startswith("I")  # what PIL makes of them (convert("RGB") clips it)
    train_x, _, test_x, _ = get_task("imagefolder").load_arrays(tmp_path, False)
    assert first_pixels(train_x) == [5, 15, 25, 45, 55, 65, 85, 95, 105]
    assert first_pixels(test_x) == [5, 45, 85]
    assert np.all(train_x[:, 0] == train_x[:, 2])  # grey: three equal channels


def test_16_bit_grey_rounds_to_the_nearest_level(tmp_path):
    path = tmp_path / "x.png"
    Image.fromarray(np.array([[0, 128, 129, 65535, 1000, 30000]], np.uint16)).save(path)
    a = get_task("imagefolder")._decode_file(path)
    assert a.shape == (3, 1, 6) and a[0, 0].tolist() == [0, 0, 1, 255, 4, 117]


def test_16_bit_rgb_pngs_keep_their_scale(tmp_path):
    values = np.zeros((4, 4, 3), np.uint16)
    values[..., 0], values[..., 1], values[..., 2] = 1000, 30000, 65535
    png16(tmp_path / "rgb.png", values)
    a = get_task("imagefolder")._decode_file(tmp_path / "rgb.png")
    assert [abs(int(a[c, 0, 0]) - v) <= 1 for c, v in enumerate((4, 117, 255))] == [True] * 3


def test_a_pixel_mode_it_cannot_scale_is_refused(tmp_path):
    path = tmp_path / "train" / "cat" / "f.png"
    write_folder(tmp_path)
    Image.fromarray(np.full((8, 8), 0.5, np.float32), "F").save(tmp_path / "f.tiff")
    (tmp_path / "f.tiff").rename(path)  # a TIFF of floats named .png: PIL opens it by content
    message = one_line_error(get_task("imagefolder"), tmp_path)
    assert str(path) in message and "mode F" in message


# --------------------------------------------------------------------------- subfolders


def test_images_in_subfolders_of_a_class_folder_are_loaded(tmp_path):
    # 180 images, 120 of them in subfolders (one level and two deep): all 180 are loaded
    values = {}
    for c, name in enumerate(CLASSES):
        for i in range(60):
            where = ("", "more/", "more/deeper/")[i % 3]
            write_image(tmp_path / "train" / name / f"{where}{i:03d}.png", c * 80 + i)
            values[(name, f"{where}{i:03d}.png")] = c * 80 + i
        write_image(tmp_path / "test" / name / "sub" / "0.png", c)
    (tmp_path / "train" / "dog" / ".hidden").mkdir()  # hidden folders stay skipped
    write_image(tmp_path / "train" / "dog" / ".hidden" / "x.png", 1)
    task = get_task("imagefolder")
    train_x, train_y, test_x, test_y = task.load_arrays(tmp_path, False)
    assert len(train_x) == 180 and np.bincount(train_y).tolist() == [60, 60, 60]
    assert len(test_x) == 3 and test_y.tolist() == [0, 1, 2]
    # path order within a class (a folder's files and subfolders by name), as the labels say
    order = sorted(values, key=lambda k: (CLASSES.index(k[0]), k[1].split("/")))
    assert first_pixels(train_x) == [values[k] for k in order]
    assert len(task.data_files(tmp_path)) == 183  # the fingerprint covers the nested files too


def test_a_changed_nested_image_is_new_data(tmp_path):
    write_folder(tmp_path)
    write_image(tmp_path / "train" / "cat" / "sub" / "x.png", 100)
    first = get_task("imagefolder").fingerprint(tmp_path)
    write_image(tmp_path / "train" / "cat" / "sub" / "x.png", 101)
    assert get_task("imagefolder").fingerprint(tmp_path) != first


# --------------------------------------------------------------------------- same size, same mtime


def test_rewrite_with_same_size_and_mtime_is_new_data(tmp_path):
    write_folder(tmp_path)
    old = time.time_ns() - 3600 * 10**9  # old enough for the content hashes to be cached
    for p in tmp_path.rglob("*.png"):
        os.utime(p, ns=(old, old))
    first = get_task("imagefolder").load(tmp_path)
    assert (tmp_path / ".hfl-bench-fingerprints.json").is_file()  # the hashes were cached
    target = tmp_path / "test" / "dog" / "000.png"
    size = target.stat().st_size
    for value in range(200, 256):  # another flat image that happens to encode to the same size
        write_image(target, value)
        if target.stat().st_size == size:
            break
    assert target.stat().st_size == size
    os.utime(target, ns=(old, old))  # as `cp -p` or a restore would leave it
    second = get_task("imagefolder").load(tmp_path)
    assert second.fingerprint != first.fingerprint
    assert not torch.equal(second.test_x, first.test_x)  # decoded again, not the old cache
    assert len(list((tmp_path / ".hfl-bench-cache").iterdir())) == 2


# --------------------------------------------------------------------------- symbolic link loops


@pytest.mark.parametrize("make_loop", ["image-to-itself", "subfolder-to-its-class", "class-to-itself",
                                       "class-to-the-root"])
def test_a_symbolic_link_loop_is_one_line(make_loop, tmp_path):
    write_folder(tmp_path)
    cat = tmp_path / "train" / "cat"
    link = {"image-to-itself": cat / "loop.png", "subfolder-to-its-class": cat / "again",
            "class-to-itself": tmp_path / "train" / "zebra",
            "class-to-the-root": tmp_path / "train" / "zebra"}[make_loop]
    target = {"image-to-itself": "loop.png", "subfolder-to-its-class": ".", "class-to-itself": "zebra",
              "class-to-the-root": "../.."}[make_loop]
    link.symlink_to(target)
    if make_loop.startswith("class"):
        (tmp_path / "test" / "zebra").mkdir()
        write_image(tmp_path / "test" / "zebra" / "0.png", 7)
    message = one_line_error(get_task("imagefolder"), tmp_path)
    assert str(link) in message and "symbolic link loop" in message.replace(str(tmp_path), ""), message
    assert str(link) in cli_error(tmp_path, tmp_path / "cli")


def test_links_that_are_not_loops_are_followed(tmp_path):
    write_folder(tmp_path / "data")
    write_folder(tmp_path / "elsewhere", train=(2, 2, 2))
    (tmp_path / "data" / "train" / "cat" / "more").symlink_to(tmp_path / "elsewhere" / "train" / "dog")
    (tmp_path / "data" / "train" / "dog" / "x.png").symlink_to(tmp_path / "elsewhere" / "train" / "owl" / "000.png")
    train_x, train_y, *_ = get_task("imagefolder").load_arrays(tmp_path / "data", False)
    assert np.bincount(train_y).tolist() == [4 + 2, 3 + 1, 5]


def test_a_broken_image_link_is_named(tmp_path):
    write_folder(tmp_path)
    (tmp_path / "train" / "owl" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    message = one_line_error(get_task("imagefolder"), tmp_path)
    assert str(tmp_path / "train" / "owl" / "gone.png") in message and "nothing" in message


# --------------------------------------------------------------------------- too large for memory


def test_images_too_large_for_memory_are_refused_before_decoding(tmp_path, monkeypatch):
    write_folder(tmp_path)
    # 18 images of 3 x 8 x 8 need 18 * 192 * 9 bytes while loading (uint8, float32 in [0, 1], normalized)
    monkeypatch.setattr(imagefolder, "available_memory", lambda: 18 * 192 * 9 - 1)
    opened = []
    real = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(a[0]) or real(*a, **k))
    message = one_line_error(get_task("imagefolder"), tmp_path)
    assert "18 images of 8x8" in message and "image_size" in message and "memory" in message, message
    assert len(opened) == 1  # refused after the first image told the size, not after decoding all
    assert "image_size" in cli_error(tmp_path, tmp_path / "cli")
    monkeypatch.setattr(imagefolder, "available_memory", lambda: 18 * 192 * 9)
    assert get_task("imagefolder").load_arrays(tmp_path, False)[0].shape == (12, 3, 8, 8)  # fits exactly


def test_memory_error_while_decoding_is_one_line(tmp_path, monkeypatch):
    write_folder(tmp_path)

    def exhausted(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(imagefolder, "_allocate", exhausted)
    message = one_line_error(get_task("imagefolder"), tmp_path)
    assert "memory" in message and "image_size" in message
    monkeypatch.setattr(Image.Image, "convert", exhausted)  # one image too large to decode at all
    message = one_line_error(get_task("imagefolder"), tmp_path)
    assert "train/cat/000.png" in message and "memory" in message
