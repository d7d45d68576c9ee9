"""Reading JPEG-stored datasets: simplejpeg's pixels are Pillow's, with and without simplejpeg installed.

Every check decodes the stored bytes with Pillow itself (not through readers) and compares; the
fallback tests take ``simplejpeg`` away (as if not installed) and must give the same pixels.
"""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imagefiles import gradient
from packer import ImageOptions, convert
from packer.preprocess.encode import encode
from readers import Loader, PackedFormatError, RAMDataset
from readers import decoders
from readers.codecs import decode_image, decode_into
from readers.formats import open_store

HAVE_SIMPLEJPEG = importlib.util.find_spec("simplejpeg") is not None
needs_simplejpeg = pytest.mark.skipif(not HAVE_SIMPLEJPEG, reason="the fast path needs simplejpeg (a dependency of packer)")


def pillow_pixels(payload: bytes, channels: int) -> np.ndarray:
    """The third-party answer: Pillow's decode of the stored bytes, as (C, H, W)."""
    with Image.open(io.BytesIO(bytes(payload))) as image:
        pixels = np.asarray(image.convert("L" if channels == 1 else "RGB"))
    return pixels[np.newaxis] if channels == 1 else pixels.transpose(2, 0, 1)


@pytest.fixture
def without_simplejpeg(monkeypatch):
    """simplejpeg as if not installed (its import fails), for the duration of a test."""
    monkeypatch.setitem(sys.modules, "simplejpeg", None)
    decoders.simplejpeg_module.cache_clear()
    yield
    monkeypatch.undo()
    decoders.simplejpeg_module.cache_clear()


@pytest.fixture
def pillow_refused(monkeypatch):
    """Pillow decoding fails loudly: what still decodes went through simplejpeg."""

    def refuse(payload, channels):
        raise AssertionError("decoded with Pillow, expected simplejpeg")

    monkeypatch.setattr(decoders, "pillow_decode", refuse)


@pytest.fixture(scope="module", params=[False, True], ids=["rgb", "gray"])
def jpeg_blob(request, image_folder, tmp_path_factory) -> Path:
    """The shared test folder converted as JPEG q90 at 40x56 (ImageNet-like: 4:2:0, OpenCV's encoder)."""
    dst = tmp_path_factory.mktemp("jpegread") / "data.blob"
    convert(image_folder, dst, image=ImageOptions(size=(40, 56), encoding="jpeg", quality=90, grayscale=request.param), workers=1)
    return dst


def stored(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every sample decoded by Pillow from its stored bytes, and the labels, in index order."""
    store = open_store(path)
    records = list((label, pillow_pixels(payload, shape[0])) for label, shape, payload in store.records(range(len(store))))
    return np.stack([pixels for _, pixels in records]), np.array([label for label, _ in records])


def read_all(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every sample through ``readers.Loader`` (2 threads, batches of 5), in index order."""
    images, labels = [], []
    for batch, got in Loader(RAMDataset(path), 5, shuffle=False, threads=2):
        images.append(batch.numpy().copy())
        labels.append(got.numpy().copy())
    return np.concatenate(images), np.concatenate(labels)


@needs_simplejpeg
def test_loader_gives_pillows_pixels_through_simplejpeg(jpeg_blob, pillow_refused):
    want, want_labels = stored(jpeg_blob)  # Pillow direct (pillow_pixels), not decoders.pillow_decode
    got, labels = read_all(jpeg_blob)
    assert np.array_equal(labels, want_labels)
    assert got.shape == want.shape and np.array_equal(got, want)


def test_loader_gives_pillows_pixels_without_simplejpeg(jpeg_blob, without_simplejpeg):
    assert decoders.simplejpeg_module() is None
    want, want_labels = stored(jpeg_blob)
    got, labels = read_all(jpeg_blob)
    assert np.array_equal(labels, want_labels) and np.array_equal(got, want)


@needs_simplejpeg
def test_store_reads_agree_with_pillow(jpeg_blob, pillow_refused):
    store = open_store(jpeg_blob)
    want, _ = stored(jpeg_blob)
    images, _ = store.read_batch([3, 0, 3])
    assert np.array_equal(images, want[[3, 0, 3]])
    assert np.array_equal(store.read(7)[0], want[7])
    assert np.array_equal(store.read_samples([5])[0][0], want[5])


def _pillow_jpeg(pixels: np.ndarray, mode: str | None = None, **save) -> bytes:
    buffer = io.BytesIO()
    image = Image.fromarray(pixels.squeeze())
    (image.convert(mode) if mode else image).save(buffer, "JPEG", quality=90, **save)
    return buffer.getvalue()


# Files of other encoders and settings than the conversion's, each: (payload, simplejpeg decodes it)
PAYLOADS = {
    "opencv 4:2:0": (lambda: encode(gradient(33, 47, seed=1), "jpeg", 90), True),
    "pillow 4:4:4": (lambda: _pillow_jpeg(gradient(33, 47, seed=2), subsampling=0), True),
    "pillow 4:2:2": (lambda: _pillow_jpeg(gradient(33, 47, seed=3), subsampling=1), True),
    "progressive": (lambda: _pillow_jpeg(gradient(33, 47, seed=4), progressive=True), True),
    "gray file": (lambda: _pillow_jpeg(gradient(33, 47, channels=1, seed=5)), True),
    "cmyk file": (lambda: _pillow_jpeg(gradient(33, 47, seed=6), "CMYK"), False),
}


@pytest.mark.parametrize("name", sorted(PAYLOADS))
@pytest.mark.parametrize("channels", [3, 1])
def test_each_kind_of_file_decodes_as_pillow_does(name, channels):
    make, fast = PAYLOADS[name]
    payload = make()
    want = pillow_pixels(payload, channels)
    out = np.full(want.shape, 7, np.uint8)
    # a colour file read as gray is declined (Pillow's RGB->L is not the file's Y plane); CMYK too
    stored_gray = name == "gray file"
    assert decoders.turbo_decode_into(payload, out) is (HAVE_SIMPLEJPEG and fast and (channels == 3 or stored_gray))
    decode_into(payload, out)
    assert np.array_equal(out, want)
    decoded = decode_image(payload, channels)
    assert np.array_equal(decoded, want)
    assert decoded.flags.writeable and decoded.flags.c_contiguous  # a view of Pillow's read-only array was not
    png = decode_image(encode(np.ascontiguousarray(want.transpose(1, 2, 0)), "png"), channels)  # Pillow's other file type
    assert np.array_equal(png, want) and png.flags.writeable and png.flags.c_contiguous
    batch = np.zeros((2, *want.shape), np.uint8)  # into a row of a batch, as the Loader does
    decode_into(memoryview(payload), batch[1])
    assert np.array_equal(batch[1], want) and not batch[0].any()


def _scan_start(payload: bytes) -> int:
    return payload.index(b"\xff\xda") + 20  # past the start-of-scan header, into the coded data


@pytest.mark.parametrize("use_simplejpeg", [pytest.param(True, marks=needs_simplejpeg), False], ids=["simplejpeg", "pillow"])
def test_damaged_files_give_what_pillow_gives(use_simplejpeg, monkeypatch):
    """Damage Pillow decodes anyway decodes to Pillow's very pixels: bytes changed inside the
    scan (no complaint from libjpeg), a stray marker in it (libjpeg warns: simplejpeg declines,
    Pillow decodes); a truncated file is one PackedFormatError line, as it always was."""
    if not use_simplejpeg:
        monkeypatch.setitem(sys.modules, "simplejpeg", None)
    decoders.simplejpeg_module.cache_clear()
    try:
        payload = encode(gradient(48, 64, seed=7), "jpeg", 90)
        start = _scan_start(payload)
        zeroed = payload[:start] + bytes(40) + payload[start + 40 :]
        marker = payload[: start + 30] + b"\xff\xd3" + payload[start + 30 :]  # a restart marker out of place
        for damaged, fast in ((zeroed, True), (marker, False)):
            want = pillow_pixels(damaged, 3)  # Pillow accepts both
            out = np.empty((3, 48, 64), np.uint8)
            assert decoders.turbo_decode_into(damaged, out) is (fast and use_simplejpeg)
            decode_into(damaged, out)
            assert np.array_equal(out, want)

        with pytest.raises(PackedFormatError) as info:
            decode_into(payload[: _scan_start(payload) + 50], out)
        assert "undecodable sample" in str(info.value) and "\n" not in str(info.value)
        with pytest.raises(PackedFormatError, match=r"decoded sample has shape \(3, 48, 64\), metadata says \(3, 48, 63\)"):
            decode_into(payload, np.empty((3, 48, 63), np.uint8))
        with pytest.raises(PackedFormatError, match="undecodable sample"):
            decode_into(b"\xff\xd8 not a jpeg", out)
    finally:
        monkeypatch.undo()
        decoders.simplejpeg_module.cache_clear()


def test_a_corrupt_stored_jpeg_names_the_sample(jpeg_blob, tmp_path):
    """A stored JPEG cut short inside the blob: one line naming the dataset and the sample."""
    store = open_store(jpeg_blob)
    payload = bytes(next(iter(store.records([2])))[2])
    out = np.empty(store.meta.shape, np.uint8)
    with pytest.raises(PackedFormatError) as info:
        store.decode(payload[: _scan_start(payload) + 10], out, 2)
    message = str(info.value)
    assert message.startswith(f"{jpeg_blob}: sample 2: undecodable sample") and "\n" not in message
