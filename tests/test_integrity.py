"""Integrity on read: ``verify=True`` readers check each sample's stored checksum as they read.

One byte of one stored sample's payload is flipped in the file (found as tests/test_verify.py
finds it); every read path (one sample, a batch through the format's fast fill, separate
samples, the torch datasets, ``readers.Loader``, DataLoader workers) then raises
:class:`CorruptSampleError` naming the dataset, the index and, for shards, the shard, while
``verify=False`` reads the damaged bytes without a word and undamaged data reads identically
either way.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import readers
from readers.checksums import CorruptSampleError
from readers.formats import store_class
from readers.schema import PackedFormatError
from test_verify import FORMATS, SUFFIX, VICTIM, _convert, _flip, _payload_location

ENCODINGS = ("raw", "jpeg")


@pytest.fixture()
def packed(image_folder, tmp_path):
    """A function ``(fmt, encoding) -> path``: a fresh 16x16 conversion to damage."""
    return lambda fmt, encoding="raw": _convert(image_folder, tmp_path / f"{encoding}{SUFFIX[fmt]}", fmt, encoding)


def _damage(path, fmt: str) -> None:
    file, offset = _payload_location(path, fmt, VICTIM)
    length = len(next(iter(p for _l, _s, p in store_class(fmt)(path).records([VICTIM]))))
    _flip(file, offset + length // 2)


def _expect_corrupt(path, fmt: str, call) -> CorruptSampleError:
    with pytest.raises(CorruptSampleError) as caught:
        call()
    exc = caught.value
    assert isinstance(exc, PackedFormatError)
    assert exc.index == VICTIM and exc.path == str(path)
    text = str(exc)
    assert str(path) in text and f"sample {VICTIM}" in text
    if fmt == "webdataset":
        shard = store_class(fmt)(path).where(VICTIM).split("(")[1].rstrip(")")
        assert shard.startswith("shard-") and shard in text
    return exc


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_flipped_byte_is_caught_on_every_read_path(packed, fmt, encoding):
    path = packed(fmt, encoding)
    _damage(path, fmt)
    store = store_class(fmt)(path, verify=True)
    _expect_corrupt(path, fmt, lambda: store.read(VICTIM))
    _expect_corrupt(path, fmt, lambda: store.read_batch([0, VICTIM, 3]))
    _expect_corrupt(path, fmt, lambda: store.read_batch([VICTIM - len(store)]))  # a negative index: named as stored
    _expect_corrupt(path, fmt, lambda: store.read_samples([VICTIM]))
    store.read_batch([0, VICTIM + 1, 3])  # the others read fine
    # verify off: the damaged bytes are returned without a word
    plain = store_class(fmt)(path, verify=False)
    image, _label = plain.read(VICTIM)
    assert image.shape == tuple(plain.meta.shape)
    plain.read_batch([0, VICTIM])


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_datasets_and_the_loader_raise_the_same_error(packed, fmt):
    path = packed(fmt)
    _damage(path, fmt)
    dataset = readers.open_dataset(path, verify=True)
    assert type(dataset).__name__ == {"lmdb": "LMDBDataset", "hdf5": "HDF5Dataset", "blob": "RAMDataset", "webdataset": "ShardDataset"}[fmt]
    _expect_corrupt(path, fmt, lambda: dataset[VICTIM])
    _expect_corrupt(path, fmt, lambda: dataset.read_batch([VICTIM]))
    _expect_corrupt(path, fmt, lambda: list(readers.Loader(dataset, batch_size=4, shuffle=False, threads=2)))
    readers.open_dataset(path, verify=False)[VICTIM]  # off: reads
    ds_cls = type(dataset)
    _expect_corrupt(path, fmt, lambda: ds_cls(path, verify=True)[VICTIM])


def test_a_dataloader_worker_sends_the_error_back(packed):
    path = packed("lmdb")
    _damage(path, "lmdb")
    loader = DataLoader(readers.LMDBDataset(path, verify=True), batch_size=4, num_workers=1)
    with pytest.raises(CorruptSampleError, match=f"sample {VICTIM} is damaged"):
        list(loader)
    exc = pickle.loads(pickle.dumps(CorruptSampleError.mismatch(str(path), VICTIM, f"sample {VICTIM}", 1, 2)))
    assert (exc.path, exc.index, exc.where) == (str(path), VICTIM, f"sample {VICTIM}")


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_undamaged_data_reads_identically_either_way(packed, fmt, encoding):
    path = packed(fmt, encoding)
    on, off = store_class(fmt)(path, verify=True), store_class(fmt)(path, verify=False)
    order = np.random.default_rng(0).permutation(len(on)).tolist() + [0, 0]  # repeats too
    a, la = on.read_batch(order)
    b, lb = off.read_batch(order)
    assert np.array_equal(a, b) and np.array_equal(la, lb)
    for i in (0, VICTIM, len(on) - 1):
        (x, y), (u, v) = on.read(i), off.read(i)
        assert np.array_equal(x, u) and y == v
    loaded = torch.cat([images for images, _labels in readers.Loader(readers.open_dataset(path, verify=True), batch_size=5, shuffle=False)])
    assert np.array_equal(loaded.numpy(), off.read_batch(range(len(off)))[0])


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_default_checks_encoded_samples_only(packed, fmt):
    """The measured choice (docs/RELIABILITY.md): jpeg/png on, raw off."""
    assert store_class(fmt)(packed(fmt, "jpeg")).verify is True
    raw = readers.open_dataset(packed(fmt))
    assert raw.store.verify is False
    assert pickle.loads(pickle.dumps(raw.store)).verify is False


def test_verify_on_a_dataset_without_checksums_is_refused(packed, monkeypatch):
    path = packed("blob")
    cls = store_class("blob")
    monkeypatch.setattr(cls, "_read_metadata", lambda self, _orig=cls._read_metadata: _no_checksum(_orig(self)))
    assert cls(path).verify is False
    with pytest.raises(PackedFormatError, match="records no checksums"):
        cls(path, verify=True)


def _no_checksum(meta):
    import dataclasses

    return dataclasses.replace(meta, checksum="")


# -- text: token stores and TokenDataset -------------------------------------------------------
DOCUMENTS = 10  # document VICTIM (7) gets the flipped byte


@pytest.fixture()
def tokens(tmp_path):
    """``fmt -> path``: 10 distinct text documents (byte tokenizer) converted to ``fmt``."""
    import packer

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(1)
    for d in range(DOCUMENTS):
        (corpus / f"{d:02d}.txt").write_text("".join(chr(c) for c in rng.integers(97, 123, 40 + d)), encoding="ascii")

    def get(fmt: str):
        path = tmp_path / f"t{SUFFIX[fmt]}"
        packer.convert(corpus, path, format=fmt, workers=1, storage=packer.StorageOptions(shard_size=3) if fmt == "webdataset" else None)
        return path

    return get


def _damage_document(path, fmt: str) -> None:
    """Flip a byte in the middle of document VICTIM's token ids, found by its own bytes (no packer layout)."""
    [document] = [bytes(p) for _l, _s, p in store_class(fmt)(path).records([VICTIM])]  # copied inside the read
    files = sorted(path.glob("*.tar")) if fmt == "webdataset" else [path / "data.mdb" if fmt == "lmdb" else path]
    found = [(f, offset) for f in files for offset in _occurrences(f.read_bytes(), document)]
    assert found
    for file, offset in found:  # LMDB may keep a stale copy in a page a later transaction freed: flip every copy
        _flip(file, offset + len(document) // 2)


def _occurrences(data: bytes, needle: bytes) -> list[int]:
    offsets, start = [], data.find(needle)
    while start >= 0:
        offsets.append(start)
        start = data.find(needle, start + 1)
    return offsets


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_flipped_token_byte_is_caught_by_token_datasets_and_the_loader(tokens, fmt):
    path = tokens(fmt)
    clean = [readers.TokenDataset(path)[d] for d in range(DOCUMENTS)]
    blocks = [readers.TokenDataset(path, block_size=16)[b] for b in range(len(readers.TokenDataset(path, block_size=16)))]
    assert [t.tolist() for t in readers.TokenDataset(path, verify=True)] == [t.tolist() for t in clean]  # undamaged: identical
    _damage_document(path, fmt)
    for dataset in (readers.TokenDataset(path, verify=True), readers.open_dataset(path, verify=True)):
        _expect_corrupt(path, fmt, lambda: dataset[VICTIM])
    windows = readers.TokenDataset(path, block_size=16, verify=True)
    _expect_corrupt(path, fmt, lambda: [windows[b] for b in range(len(windows))])
    _expect_corrupt(path, fmt, lambda: list(readers.Loader(readers.TokenDataset(path, block_size=16, verify=True), batch_size=4)))
    damaged = readers.TokenDataset(path)[VICTIM]  # verify off (the default): the damaged ids, without a word
    assert damaged.shape == clean[VICTIM].shape and damaged.tolist() != clean[VICTIM].tolist()
    assert readers.TokenDataset(path, verify=True)[VICTIM + 1].tolist() == clean[VICTIM + 1].tolist()
    assert len(blocks) == len(windows)
