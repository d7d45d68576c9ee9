"""Hostile and odd input: damaged, huge, tiny, exotic and unreadable files, odd trees and names.

Every input either converts or becomes a skipped input with a reproducible reason; nothing
crashes the conversion, hangs it or exhausts memory. Random inputs are generated with
hypothesis (bounded examples, so the whole file runs in seconds).
"""

from __future__ import annotations

import io
import json
import os
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from imagefiles import gradient, jpeg_bytes, png_bytes, write
from unprivileged import run_unprivileged, world_readable_dir
from packer import ImageOptions, convert
from packer.cli import cli
from packer.errors import InputError
from packer.options import DEFAULT_MAX_PIXELS, StorageOptions
from packer.preprocess.decode import DecodeError, decode
from packer.preprocess.task import Encoded, Failed, ImageTask
from packer.sources.images import ImageItem, scan_image_folder
from readers.formats import STORES, open_store, store_class
from readers.schema import IncompleteDatasetError, Metadata, PackedFormatError

LIMIT = 10**8
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def encoded(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims ``width`` x ``height`` pixels: a decompression bomb's shape."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def run_task(path: Path, **options) -> Encoded | Failed:
    return ImageTask(ImageOptions(**options))(ImageItem(str(path), 0))


# -- decoding ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["PNG", "GIF", "TIFF", "BMP", "WEBP", "JPEG"])
def test_the_pixel_limit_holds_for_every_format(fmt):
    data = encoded(Image.new("L", (2000, 1000)), fmt)
    with pytest.raises(DecodeError, match=r"^2000x1000 has 2,000,000 pixels, more than --max-pixels 1,000,000$"):
        decode(data, grayscale=False, target=None, max_pixels=1_000_000)


def test_a_decompression_bomb_is_refused_from_its_header_naming_max_pixels():
    pillows_own = Image.MAX_IMAGE_PIXELS
    start = time.monotonic()
    data = png_header_only(60_000, 60_000)  # 10.8 GB of RGB if decoded; over Pillow's own limit too
    with pytest.raises(DecodeError, match="^60000x60000 has 3,600,000,000 pixels, more than --max-pixels 89,478,485$"):
        decode(data, grayscale=False, target=None, max_pixels=DEFAULT_MAX_PIXELS)
    with pytest.raises(DecodeError, match="^9000x9000 has 81,000,000 pixels, more than --max-pixels 1,000,000$"):
        decode(png_header_only(9000, 9000), grayscale=False, target=None, max_pixels=1_000_000)
    assert time.monotonic() - start < 1  # nothing was decoded
    assert Image.MAX_IMAGE_PIXELS == pillows_own  # set only while decoding


def test_max_pixels_above_pillows_limit_is_the_users_choice():
    data = png_header_only(14_000, 14_000)  # 196,000,000 pixels: Pillow alone refuses anything over 178,956,970
    with pytest.raises(DecodeError, match="^14000x14000 has 196,000,000 pixels, more than --max-pixels 100,000,000$"):
        decode(data, grayscale=False, target=None, max_pixels=100_000_000)
    with pytest.raises(DecodeError) as caught:  # allowed: Pillow opens it and fails on the missing pixel data instead
        decode(data, grayscale=False, target=None, max_pixels=200_000_000)
    assert "pixels" not in str(caught.value)


def test_the_bomb_skip_names_max_pixels_through_the_command_line(tmp_path):
    src = tmp_path / "src"
    write(src / "a" / "small.png", png_bytes(Image.new("RGB", (10, 10))))
    write(src / "a" / "big.png", png_bytes(Image.new("RGB", (50, 40))))  # 2,000 pixels
    write(src / "b" / "bomb.png", png_header_only(60_000, 60_000))
    result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "out.lmdb"), "--size", "8", "--max-pixels", "1000", "-q", "-j", "1"])
    assert result.exit_code == 0, result.output
    meta = open_store(tmp_path / "out.lmdb").meta
    assert {(s.path, s.reason) for s in meta.skipped} == {
        ("a/big.png", "50x40 has 2,000 pixels, more than --max-pixels 1,000"),
        ("b/bomb.png", "60000x60000 has 3,600,000,000 pixels, more than --max-pixels 1,000"),
    }
    assert meta.count == 1


def test_a_one_pixel_image_converts():
    data = png_bytes(Image.new("RGB", (1, 1), (10, 20, 30)))
    pixels = decode(data, grayscale=False, target=None, max_pixels=LIMIT)
    assert pixels.shape == (1, 1, 3) and tuple(pixels[0, 0]) == (10, 20, 30)


def test_animated_gif_gives_its_first_frame_in_colour():
    frames = [Image.new("RGB", (8, 6), color) for color in ((255, 0, 0), (0, 0, 255))]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:])
    out = decode(data, grayscale=False, target=None, max_pixels=LIMIT)
    assert out.shape == (6, 8, 3) and tuple(out[0, 0]) == (255, 0, 0)


def test_cmyk_jpeg_with_exif_rotation_is_upright_rgb():
    upright = gradient(20, 40)
    stored = Image.fromarray(np.ascontiguousarray(np.rot90(upright, 1))).convert("CMYK")
    exif = stored.getexif()
    exif[0x0112] = 6
    out = decode(encoded(stored, "JPEG", exif=exif, quality=95), grayscale=False, target=None, max_pixels=LIMIT)
    assert out.shape == (20, 40, 3)


def test_sixteen_bit_rgb_png_converts():
    values = (np.arange(12, dtype=np.uint16).reshape(2, 2, 3) * 5000).astype(">u2")
    raw = b"".join(b"\0" + row.tobytes() for row in values)  # filter type 0 per row
    ihdr = struct.pack(">IIBBBBB", 2, 2, 16, 2, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    out = decode(data, grayscale=False, target=None, max_pixels=LIMIT)
    assert out.shape == (2, 2, 3) and out.dtype == np.uint8


@pytest.mark.parametrize("data", [png_header_only(10, 10)[:30], b"GIF89a" + bytes(20), b"\x89PNG\r\n\x1a\n" + b"x" * 40, b"II*\0" + bytes(30)])
def test_skip_reasons_are_reproducible(data):
    with pytest.raises(DecodeError) as caught:
        decode(data, grayscale=False, target=None, max_pixels=LIMIT)
    assert " at 0x" not in str(caught.value) and "object" not in str(caught.value)


# -- one input file, through the worker's task -------------------------------------------------
def test_a_png_named_jpg_converts(tmp_path):
    result = run_task(write(tmp_path / "really_a.jpg", png_bytes(Image.new("RGB", (5, 4)))), size=(4, 4))
    assert isinstance(result, Encoded) and result.shape == (3, 4, 4)


def test_an_empty_file_is_skipped(tmp_path):
    assert run_task(write(tmp_path / "empty.jpg", b"")) == Failed(str(tmp_path / "empty.jpg"), "empty file (0 bytes)")


def test_a_fifo_or_device_named_like_an_image_is_skipped_at_once(tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    start = time.monotonic()
    assert run_task(fifo).reason == "not a regular file"
    (tmp_path / "zero.jpg").symlink_to("/dev/zero")
    assert run_task(tmp_path / "zero.jpg").reason == "not a regular file"
    assert time.monotonic() - start < 1


def test_a_broken_symlink_is_skipped(tmp_path):
    (tmp_path / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    assert run_task(tmp_path / "gone.jpg").reason == "cannot read (No such file or directory)"


def test_an_unreadable_file_is_skipped():
    with world_readable_dir() as root:  # checked as an unprivileged user: root reads anything
        path = write(root / "secret.jpg", jpeg_bytes(gradient(8, 8)))
        path.chmod(0)
        assert run_unprivileged(run_task, path).reason == "cannot read (Permission denied)"


_SEEDS = {
    "jpeg": jpeg_bytes(gradient(24, 32)),
    "png": png_bytes(Image.fromarray(gradient(24, 32))),
    "gif": encoded(Image.fromarray(gradient(24, 32)).convert("P"), "GIF"),
    "tiff": encoded(Image.fromarray(gradient(24, 32)), "TIFF"),
    "webp": encoded(Image.fromarray(gradient(24, 32)), "WEBP"),
    "bmp": encoded(Image.fromarray(gradient(24, 32)), "BMP"),
}


@st.composite
def damaged_images(draw) -> bytes:
    """A real image file with random bytes overwritten and maybe truncated, or pure noise."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=2000))
    data = bytearray(_SEEDS[draw(st.sampled_from(sorted(_SEEDS)))])
    for _ in range(draw(st.integers(1, 8))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(1, len(data)))])


@FAST
@given(data=damaged_images())
def test_random_and_damaged_images_are_converted_or_skipped(tmp_path_factory, data):
    path = tmp_path_factory.getbasetemp() / "fuzz.img"
    path.write_bytes(data)
    result = run_task(path, size=(8, 8), max_pixels=4_000_000)
    assert isinstance(result, (Encoded, Failed))
    if isinstance(result, Failed):
        assert result.reason and " at 0x" not in result.reason
    else:
        assert result.shape == (3, 8, 8) and len(result.payload) == 3 * 8 * 8


# -- metadata records and packed files ---------------------------------------------------------
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)


@FAST
@given(raw=st.binary(max_size=300) | _JSON.map(json.dumps) | _JSON.map(lambda v: json.dumps({"format": "lmdb", "version": 1, "count": 3, "x": v})))
def test_random_metadata_records_raise_only_packed_format_errors(raw):
    try:
        Metadata.from_json(raw)
    except PackedFormatError:
        pass


def _plant(root: Path, fmt: str, data: bytes) -> Path:
    """``data`` placed where ``fmt`` keeps its main file, with that format's signature."""
    if fmt == "lmdb":
        write(root / "x.lmdb" / "data.mdb", data)
        return root / "x.lmdb"
    if fmt == "hdf5":
        return write(root / "x.h5", b"\x89HDF\r\n\x1a\n" + data)
    if fmt == "blob":
        return write(root / "x.blob", b"PACKBLOB" + data)
    write(root / "x.shards" / "packer.json", data[: len(data) // 2])
    write(root / "x.shards" / "shard-000000.tar", data[len(data) // 2 :])
    return root / "x.shards"


@pytest.mark.parametrize("fmt", sorted(STORES))
def test_random_bytes_as_a_packed_dataset_are_clear_errors(fmt, tmp_path_factory):
    @settings(max_examples=25, deadline=None)
    @given(data=st.binary(max_size=5000))
    def check(data: bytes) -> None:
        root = Path(tmp_path_factory.mktemp("fuzz"))
        path = _plant(root, fmt, data)
        for opener in (open_store, store_class(fmt)):
            try:
                store = opener(path)
                if len(store):
                    store.read(0)
            except (PackedFormatError, IncompleteDatasetError, FileNotFoundError):
                pass

    check()


# -- source trees -----------------------------------------------------------------------------
def test_non_utf8_file_and_class_names_convert_and_are_recorded(tmp_path):
    src = tmp_path / "src"
    good, bad = jpeg_bytes(gradient(8, 8)), b"not an image"
    root = os.fsencode(src)
    os.makedirs(os.path.join(root, b"caf\xe9"))
    os.makedirs(os.path.join(root, b"plain"))
    for name, data in ((b"caf\xe9/\xff\xfe.jpg", good), (b"caf\xe9/bad\xff.jpg", bad), (b"plain/a.jpg", good)):
        with open(os.path.join(root, name), "wb") as handle:
            handle.write(data)
    for fmt, suffix in (("lmdb", ".lmdb"), ("webdataset", ".shards")):
        report = convert(src, tmp_path / f"out{suffix}", format=fmt, image=ImageOptions(size=8), workers=2)
        assert report.written == 2
        meta = open_store(tmp_path / f"out{suffix}").meta
        assert meta.classes == (os.fsdecode(b"caf\xe9"), "plain")
        assert [s.path for s in meta.skipped] == [os.fsdecode(b"caf\xe9/bad\xff.jpg")]


def test_special_files_in_the_tree_are_skipped_not_waited_for(tmp_path):
    write(tmp_path / "src" / "cat" / "a.jpg", jpeg_bytes(gradient(8, 8)))
    os.mkfifo(tmp_path / "src" / "cat" / "b.jpg")
    (tmp_path / "src" / "cat" / "c.jpg").symlink_to("/dev/zero")
    report = convert(tmp_path / "src", tmp_path / "out.lmdb", image=ImageOptions(size=8), workers=2)
    assert report.written == 1
    assert sorted((s.path, s.reason) for s in report.skipped) == [("cat/b.jpg", "not a regular file"), ("cat/c.jpg", "not a regular file")]


def test_an_unlistable_folder_is_skipped_and_recorded():
    with world_readable_dir() as root:  # scanned as an unprivileged user: root lists anything
        write(root / "cat" / "a.jpg", jpeg_bytes(gradient(8, 8)))
        write(root / "cat" / "locked" / "b.jpg", jpeg_bytes(gradient(8, 8)))
        for folder in (root / "cat", root / "cat" / "locked"):
            folder.chmod(0o755)
        (root / "cat" / "a.jpg").chmod(0o644)
        (root / "cat" / "locked").chmod(0)
        folder = run_unprivileged(scan_image_folder, root)
    assert [os.path.basename(i.path) for i in folder.items] == ["a.jpg"]
    assert [(s.path, s.reason) for s in folder.skipped] == [("cat/locked", "cannot list folder (Permission denied)")]
    assert folder.refused == folder.skipped  # an input error: --on-error fail stops at it, as at an unreadable file


# -- crashes and hangs at the conversion level -------------------------------------------------
def test_inputs_that_overrun_the_timeout_are_skipped_with_the_reason(image_folder, tmp_path):
    # A microsecond is over before a worker can answer (almost always): the worker is killed
    # and replaced, its input skipped with the reason; an input that does beat it is kept.
    reason = "timed out after 1e-06 s"
    try:
        report = convert(image_folder, tmp_path / "out.lmdb", image=ImageOptions(size=8), workers=2, timeout=1e-6)
    except InputError as exc:  # every input overran
        assert f": {reason})" in str(exc)
    else:
        assert report.skipped and {s.reason for s in report.skipped} == {reason}
        assert report.written + len(report.skipped) == 18
        assert open_store(tmp_path / "out.lmdb").meta.skipped == tuple(report.skipped)
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(tmp_path / "o.h5"), "-j", "2", "--timeout", "0.000001"])
    assert result.exit_code in (0, 1) and f": {reason}" in result.stderr
    assert "Traceback" not in result.output


def test_a_webdataset_piece_that_overruns_is_a_clear_error(image_folder, tmp_path):
    """2 pieces of 9 for 2 workers: converted in fragments (of 5 and 4), each one task; a task that
    overruns stops the conversion, naming its first input."""
    with pytest.raises(InputError, match=r"class_0\d/img_\d+.jpg: the worker converting the webdataset piece of \d+ inputs .* timed out"):
        convert(image_folder, tmp_path / "out.shards", format="webdataset", image=ImageOptions(size=8), workers=2,
                storage=StorageOptions(shard_size=9), timeout=1e-6)
    assert not (tmp_path / "out.shards").exists()
