"""Every encoding round-trips through every format, and the encoding table agrees with itself.

Small generated pictures (PNG sources, so the pixels are known exactly) are converted with each
encoding to each format by ``packer.convert``, then read back by the format's plain library as
docs/FORMATS.md describes it (``lmdb``, ``h5py``, ``numpy`` on the blob, ``tarfile`` on the
shards: tests/roundtrip_checks.py ``read_plain``) and decoded with Pillow directly: ``raw`` and
``png`` give the pixels back exactly, ``jpeg`` within a PSNR bound. The expected member
extensions and file types come from docs/FORMATS.md, written out here, not from the table.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imagefiles import gradient
from packer import ImageOptions, convert
from packer.preprocess.encode import ENCODERS, encode
from readers import schema
from readers.encodings import ENCODINGS
from readers.formats.webdataset import EXTENSIONS
from roundtrip_checks import read_plain
from conftest import SUFFIX

#: docs/FORMATS.md, "WebDataset shards" / "Members": the image member of each encoding.
DOCUMENTED_EXTENSION = {"raw": "npy", "jpeg": "jpg", "png": "png"}
#: What Pillow must recognise an encoded payload as (``None``: raw pixels, no file format).
PILLOW_FORMAT = {"raw": None, "jpeg": "JPEG", "png": "PNG"}
#: Lowest PSNR (dB) a JPEG sample may have against its source pixels (q90 on smooth pictures
#: gives 39.7-43.6 dB here; a wrong channel order or a shifted image falls far below).
JPEG_MIN_PSNR = 30.0

SIZES = ((20, 30), (24, 16))  # (height, width): mixed shapes take each format's flat layout


def _pictures(channels: int, mixed: bool) -> list[tuple[str, int, np.ndarray]]:
    """(relative path, label, (H, W, C) pixels) of 2 classes x 3 pictures, in scan order."""
    out = []
    for label in range(2):
        for j in range(3):
            height, width = SIZES[(label + j) % 2] if mixed else SIZES[0]
            out.append((f"class_{label}/{j:02d}.png", label, gradient(height, width, channels, seed=10 * label + j)))
    return out


def _write(src: Path, pictures) -> None:
    for name, _, pixels in pictures:
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels.squeeze(-1) if pixels.shape[-1] == 1 else pixels).save(path, "PNG")


def _psnr(got: np.ndarray, want: np.ndarray) -> float:
    mse = np.mean((got.astype(np.float64) - want.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _pillow_pixels(payload: bytes, channels: int) -> tuple[str, np.ndarray]:
    with Image.open(io.BytesIO(payload)) as image:
        kind = image.format
        pixels = np.asarray(image.convert("L" if channels == 1 else "RGB"))
    return kind, pixels[np.newaxis] if channels == 1 else pixels.transpose(2, 0, 1)


@pytest.mark.parametrize("fmt", schema.FORMATS)
@pytest.mark.parametrize("encoding", sorted(DOCUMENTED_EXTENSION))
@pytest.mark.parametrize("channels, mixed", [(3, False), (1, True)], ids=["rgb-fixed", "gray-mixed"])
def test_every_encoding_round_trips_through_every_format(tmp_path, fmt, encoding, channels, mixed):
    pictures = _pictures(channels, mixed)
    _write(tmp_path / "src", pictures)
    dst = tmp_path / f"out{SUFFIX[fmt]}"
    convert(tmp_path / "src", dst, format=fmt, image=ImageOptions(encoding=encoding, grayscale=channels == 1), workers=1)

    meta, samples = read_plain(dst)
    assert meta["encoding"] == encoding and meta["count"] == len(pictures)
    assert [s.label for s in samples] == [label for _, label, _ in pictures]
    for i, (sample, (name, _, pixels)) in enumerate(zip(samples, pictures)):
        want = pixels.transpose(2, 0, 1)
        where = f"{fmt}/{encoding} sample {i} ({name})"
        if encoding == "raw":
            assert sample.shape == want.shape and len(sample.payload) == want.size, where
            got = np.frombuffer(sample.payload, np.uint8).reshape(want.shape)
        else:
            kind, got = _pillow_pixels(sample.payload, channels)
            assert kind == PILLOW_FORMAT[encoding], f"{where}: payload is a {kind} file, expected {PILLOW_FORMAT[encoding]}"
        assert got.shape == want.shape, f"{where}: shape {got.shape}, expected {want.shape}"
        if encoding == "jpeg":
            assert _psnr(got, want) >= JPEG_MIN_PSNR, f"{where}: PSNR {_psnr(got, want):.1f} dB"
        else:
            assert np.array_equal(got, want), f"{where}: pixels differ"

    if fmt == "webdataset":  # the member names docs/FORMATS.md gives, read with tarfile
        names = []
        for shard in meta["extra"]["shards"]:
            with tarfile.open(dst / shard) as tar:
                names += tar.getnames()
        expected = [f"{i:010d}.{ext}" for i in range(len(pictures)) for ext in (DOCUMENTED_EXTENSION[encoding], "cls")]
        assert names == expected


def test_the_encoding_tables_agree():
    """One table (readers/encodings.py); the names everyone else keys by are its names."""
    names = set(ENCODINGS)
    assert set(schema.ENCODINGS) == names, "readers.schema.ENCODINGS"
    assert set(ENCODERS) == names, "packer.preprocess.encode.ENCODERS"
    assert EXTENSIONS == {name: e.extension for name, e in ENCODINGS.items()}
    assert {name: e.extension for name, e in ENCODINGS.items()} == DOCUMENTED_EXTENSION, "docs/FORMATS.md, Members"
    assert all(e.name == name and e.ratio >= 1 for name, e in ENCODINGS.items())


@pytest.mark.parametrize("encoding", sorted(DOCUMENTED_EXTENSION))
@pytest.mark.parametrize("channels", [1, 3])
def test_each_encoder_is_undone_by_its_decoder(encoding, channels):
    """``encode`` then the table's decoder (``None``: the payload is planar pixels) gives the pixels."""
    pixels = gradient(18, 26, channels, seed=3)
    payload = encode(pixels, encoding, 95)
    decode = ENCODINGS[encoding].decode
    if decode is None:
        got = np.frombuffer(payload, np.uint8).reshape(channels, 18, 26)
    else:
        assert _pillow_pixels(payload, channels)[0] == PILLOW_FORMAT[encoding]
        got = decode(payload, channels)
    want = pixels.transpose(2, 0, 1)
    assert got.shape == want.shape
    if encoding == "jpeg":
        assert _psnr(got, want) >= JPEG_MIN_PSNR
    else:
        assert np.array_equal(got, want)
