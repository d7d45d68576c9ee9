"""The checks of every round-trip test, shared with tests/test_mutations.py (which shows each one
fails on a conversion broken on purpose).

A converted dataset is checked against an oracle computed without packer (the expected pixels
and labels, or a third-party tokenizer's ids) twice: read by the format's plain library, as
docs/FORMATS.md describes it (``lmdb``, ``h5py``, ``numpy`` on the blob, ``tarfile`` + ``numpy``
on WebDataset shards; nothing from ``readers``), and read by ``readers``. Every mismatch is an
``AssertionError`` naming the sample.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

__all__ = [
    "PlainSample", "read_plain", "check_images", "check_images_plain", "check_images_readers",
    "check_tokens", "check_tokens_plain", "check_tokens_readers",
]


@dataclass(frozen=True)
class PlainSample:
    """One stored sample as its format's own library sees it: label, (C, H, W), payload bytes
    (raw pixels, little-endian token ids, or the encoded image file)."""

    label: int
    shape: tuple[int, int, int]
    payload: bytes


# -- plain readers: one per format, from docs/FORMATS.md ------------------------------------
def read_plain(dst: Path) -> tuple[dict, list[PlainSample]]:
    """The metadata record and every sample of the dataset at ``dst``, in index order."""
    dst = Path(dst)
    if (dst / "data.mdb").is_file():
        return _plain_lmdb(dst)
    if (dst / "packer.json").is_file():
        return _plain_webdataset(dst)
    with open(dst, "rb") as handle:
        magic = handle.read(8)
    if magic == b"PACKBLOB":
        return _plain_blob(dst)
    if magic == b"\x89HDF\r\n\x1a\n":
        return _plain_hdf5(dst)
    raise AssertionError(f"{dst}: not a dataset any plain reader here recognises")


def _plain_lmdb(dst: Path) -> tuple[dict, list[PlainSample]]:
    import lmdb

    env = lmdb.open(str(dst), readonly=True, lock=False, subdir=True)
    try:
        with env.begin() as txn:
            meta = json.loads(txn.get(b"__meta__"))
            samples = []
            for i in range(meta["count"]):
                value = txn.get(b"%010d" % i)
                assert value is not None, f"{dst}: no record for sample {i}"
                label, height, width, channels, _ = struct.unpack_from("<iIIHH", value)
                samples.append(PlainSample(label, (channels, height, width), bytes(value[16:])))
            assert txn.get(b"%010d" % meta["count"]) is None, f"{dst}: more records than count {meta['count']}"
    finally:
        env.close()
    return meta, samples


def _plain_hdf5(dst: Path) -> tuple[dict, list[PlainSample]]:
    import h5py

    with h5py.File(dst, "r") as f:
        meta = json.loads(f.attrs["packer_metadata"])
        labels = f["labels"][:].tolist()
        if "images" in f:  # fixed layout
            images = f["images"][:]
            samples = [PlainSample(labels[i], tuple(images.shape[1:]), images[i].tobytes()) for i in range(len(images))]
        else:  # flat layout
            offsets, shapes, payload = f["offsets"][:], f["shapes"][:], f["payload"][:]
            samples = [
                PlainSample(labels[i], tuple(int(d) for d in shapes[i]), payload[offsets[i] : offsets[i + 1]].tobytes())
                for i in range(len(labels))
            ]
    return meta, samples


def _plain_blob(dst: Path) -> tuple[dict, list[PlainSample]]:
    raw = dst.read_bytes()
    magic, _version, _alignment, count, *pairs = struct.unpack_from("<8sIIQ12Q", raw)
    sections = dict(zip(["data", "labels", "offsets", "shapes", "checksums", "metadata"], zip(pairs[0::2], pairs[1::2])))

    def section(name: str, dtype: str) -> np.ndarray:
        start, length = sections[name]
        return np.frombuffer(raw, dtype, count=length // np.dtype(dtype).itemsize, offset=start)

    meta = json.loads(section("metadata", "u1").tobytes())
    data, labels = section("data", "u1"), section("labels", "<i8").tolist()
    assert len(labels) == count
    if meta["encoding"] == "raw" and meta["shape"] is not None:  # one (N, C, H, W) array
        shape = tuple(meta["shape"])
        size = int(np.prod(shape))
        assert len(data) == count * size
        return meta, [PlainSample(labels[i], shape, data[i * size : (i + 1) * size].tobytes()) for i in range(count)]
    offsets, shapes = section("offsets", "<i8"), section("shapes", "<i8").reshape(-1, 3)
    return meta, [
        PlainSample(labels[i], tuple(int(d) for d in shapes[i]), data[offsets[i] : offsets[i + 1]].tobytes()) for i in range(count)
    ]


def _plain_webdataset(dst: Path) -> tuple[dict, list[PlainSample]]:
    meta = json.loads((dst / "packer.json").read_text(encoding="utf-8"))
    members: dict[str, dict[str, bytes]] = {}
    order: list[str] = []
    for shard in meta["extra"]["shards"]:
        with tarfile.open(dst / shard) as tar:
            for member in tar:
                key, _, ext = member.name.partition(".")
                if key not in members:
                    order.append(key)
                members.setdefault(key, {})[ext] = tar.extractfile(member).read()
    assert order == ["%010d" % i for i in range(len(order))], f"{dst}: sample keys are not 0 .. count-1 in order"
    samples = []
    for key in order:
        files = members[key]
        label = int(files.pop("cls"))
        (ext, payload), = files.items()
        if ext == "npy":
            array = np.load(io.BytesIO(payload), allow_pickle=False)
            shape = array.shape if array.ndim == 3 else (1, 1, array.shape[0])  # text: 1-D ids
            samples.append(PlainSample(label, tuple(shape), array.astype(array.dtype.newbyteorder("<")).tobytes()))
        else:
            image = Image.open(io.BytesIO(payload))
            samples.append(PlainSample(label, (len(image.getbands()), image.height, image.width), payload))
    return meta, samples


# -- images ---------------------------------------------------------------------------------
def _decoded(sample: PlainSample, encoding: str) -> np.ndarray:
    if encoding == "raw":
        return np.frombuffer(sample.payload, np.uint8).reshape(sample.shape)
    pixels = np.asarray(Image.open(io.BytesIO(sample.payload)))
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def _same_pixels(got: np.ndarray, want: np.ndarray, max_mean_error: float, where: str) -> None:
    assert got.shape == want.shape, f"{where}: shape {got.shape}, expected {want.shape}"
    if max_mean_error == 0:
        assert np.array_equal(got, want), f"{where}: pixels differ"
    else:
        error = np.abs(got.astype(int) - want.astype(int)).mean()
        assert error < max_mean_error, f"{where}: mean pixel error {error:.2f} >= {max_mean_error}"


def check_images_plain(dst: Path, want: Sequence[tuple[np.ndarray, int]], max_mean_error: float = 0) -> None:
    """``dst`` read by its format's plain library holds exactly ``want`` ((C, H, W) pixels, label), in order."""
    meta, samples = read_plain(dst)
    assert meta["count"] == len(samples) == len(want), f"{dst}: {meta['count']} / {len(samples)} samples, expected {len(want)}"
    assert [s.label for s in samples] == [label for _, label in want], f"{dst}: labels differ"
    for i, (sample, (pixels, _)) in enumerate(zip(samples, want)):
        _same_pixels(_decoded(sample, meta["encoding"]), pixels, max_mean_error, f"{dst} sample {i}")


def check_images_readers(dst: Path, want: Sequence[tuple[np.ndarray, int]], max_mean_error: float = 0) -> None:
    """``dst`` read by ``readers`` (its torch-free store) holds exactly ``want``, in order."""
    from readers.formats import open_store

    store = open_store(dst)
    assert len(store) == store.meta.count == len(want), f"{dst}: {len(store)} samples, expected {len(want)}"
    samples = store.read_samples(range(len(store)))
    assert [int(label) for _, label in samples] == [label for _, label in want], f"{dst}: labels differ"
    for i, ((got, _), (pixels, _)) in enumerate(zip(samples, want)):
        _same_pixels(np.asarray(got), pixels, max_mean_error, f"{dst} sample {i} (readers)")
    if store.meta.fixed_shape:
        images, labels = store.read_batch(range(len(store)))
        assert [int(label) for label in labels] == [label for _, label in want], f"{dst}: batch labels differ"
        for i, (pixels, _) in enumerate(want):
            _same_pixels(np.asarray(images[i]), pixels, max_mean_error, f"{dst} batch sample {i} (readers)")


def check_images(dst: Path, want: Sequence[tuple[np.ndarray, int]], max_mean_error: float = 0) -> None:
    """Both: the plain library's view and ``readers``' view of ``dst`` are ``want``."""
    check_images_plain(dst, want, max_mean_error)
    check_images_readers(dst, want, max_mean_error)


# -- text -----------------------------------------------------------------------------------
def check_tokens_plain(dst: Path, want: Sequence[Sequence[int]]) -> None:
    """``dst`` read by its format's plain library holds one document per ``want`` entry (its ids,
    EOS included), in order, as unlabeled (1, 1, n) samples of the recorded dtype."""
    meta, samples = read_plain(dst)
    assert meta["kind"] == "text" and meta["count"] == len(samples) == len(want), f"{dst}: {len(samples)} documents, expected {len(want)}"
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    for i, (sample, ids) in enumerate(zip(samples, want)):
        assert sample.label == -1 and sample.shape == (1, 1, len(ids)), f"{dst} document {i}: label {sample.label}, shape {sample.shape}"
        assert np.frombuffer(sample.payload, dtype).tolist() == list(ids), f"{dst} document {i}: ids differ"
    assert meta["tokens"] == sum(len(ids) for ids in want), f"{dst}: metadata counts {meta['tokens']} tokens"


def check_tokens_readers(dst: Path, want: Sequence[Sequence[int]], expect_tokenizer: str | Path | None = None) -> None:
    """``dst`` read by ``readers.TokenDataset`` (checking the tokenizer, if given) holds ``want``."""
    from readers import TokenDataset

    ds = TokenDataset(dst, expect_tokenizer=expect_tokenizer)
    assert len(ds) == len(want), f"{dst}: {len(ds)} documents, expected {len(want)}"
    for i, ids in enumerate(want):
        assert ds[i].tolist() == list(ids), f"{dst} document {i}: ids differ (readers)"
    assert ds.meta.tokens == sum(len(ids) for ids in want)


def check_tokens(dst: Path, want: Sequence[Sequence[int]], expect_tokenizer: str | Path | None = None) -> None:
    """Both: the plain library's view and ``readers``' view of ``dst`` are ``want``."""
    check_tokens_plain(dst, want)
    check_tokens_readers(dst, want, expect_tokenizer)
