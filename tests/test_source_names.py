"""Per-sample source names (``readers/formats/names.py``): every format records which input each
sample came from, readable with the format's plain library; the names survive a SIGKILL and a
``--resume``; sources other than folders record their own names; a dataset without names
(written before they existed) reads as ``None``."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest

from checkpoints import convert_until_checkpoint
from imagefiles import jpeg_bytes, write
from packer import ImageOptions, StorageOptions, convert
from packer.preprocess.task import Encoded
from packer.samples import natural_image
from packer.writers import get_writer
from packer.writers.journal import Checkpoint, Journal, ROW_DTYPE, journal_path
from readers.formats import open_store
from readers.schema import Metadata

FORMATS = ("lmdb", "hdf5", "blob", "webdataset")
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob", "webdataset": ".shards"}


def plain_names(path: Path, fmt: str) -> list[str] | None:
    """The stored names read with the format's own library (lmdb, h5py, json, struct): no packer."""
    if fmt == "lmdb":
        env = lmdb.open(str(path), subdir=True, readonly=True, lock=False)
        with env.begin() as txn:
            raw = txn.get(b"__sources__")
        env.close()
    elif fmt == "hdf5":
        with h5py.File(path, "r") as file:
            raw = file["sources"][()].tobytes() if "sources" in file else None
    elif fmt == "webdataset":
        raw = (path / "packer-sources.json").read_bytes() if (path / "packer-sources.json").exists() else None
    else:  # the (offset, length) pair after the 120-byte header, as docs/FORMATS.md says
        with open(path, "rb") as handle:
            header = handle.read(136)
            offset, length = struct.unpack_from("<QQ", header, struct.calcsize("<8sIIQ12Q"))
            handle.seek(offset)
            raw = handle.read(length) if length else None
    return None if raw is None else json.loads(raw)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_records_every_samples_source_in_index_order(fmt, with_bad, tmp_path):
    dst = tmp_path / f"d{SUFFIX[fmt]}"
    storage = StorageOptions(shard_size=5) if fmt == "webdataset" else None
    convert(with_bad, dst, format=fmt, image=ImageOptions(size=16), storage=storage, workers=2)
    names = plain_names(dst, fmt)  # first: LMDB opens a file once per process
    store = open_store(dst)
    skipped = {s.path for s in store.meta.skipped}
    assert skipped == {"class_00/000_bad.jpg", "class_01/zzz_bad.jpg"}
    expected = [str(p.relative_to(with_bad)) for p in sorted(with_bad.rglob("*.jpg"))]
    expected = [name for name in expected if name not in skipped]
    assert names == expected == store.source_names()
    assert store.source_name(0) == expected[0] and store.source_name(-1) == expected[-1]
    with pytest.raises(IndexError):
        store.source_name(len(expected))


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> Path:
    """160 full-size JPEGs in 2 classes (a second or so of work at one worker)."""
    root = tmp_path_factory.mktemp("names-src")
    data = jpeg_bytes(natural_image(np.random.default_rng(0), 375, 500), quality=90)
    for i in range(160):
        write(root / f"c{i % 2}" / f"{i:04d}.jpg", data)
    return root


@pytest.mark.parametrize("fmt", FORMATS)
def test_names_survive_a_sigkill_and_a_resume(fmt, jpegs, tmp_path):
    dst = tmp_path / f"d{SUFFIX[fmt]}"
    args = ["convert", str(jpegs), str(dst), "-j", "1", "-q", "--size", "24", "--format", fmt]
    storage = StorageOptions(shard_size=20) if fmt == "webdataset" else None
    if fmt == "webdataset":
        args += ["--shard-size", "20"]
    journal = journal_path(dst.with_name(dst.name + ".partial")) / "journal.json"
    saved = convert_until_checkpoint(args, journal)
    assert 0 < saved < 160
    convert(jpegs, dst, format=fmt, image=ImageOptions(size=24), storage=storage, workers=2, resume=True)
    expected = [f"c{c}/{i:04d}.jpg" for c in (0, 1) for i in range(c, 160, 2)]
    assert plain_names(dst, fmt) == expected


def test_sources_other_than_folders_record_their_own_names(tmp_path, image_folder):
    import tarfile

    archive = tmp_path / "images.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(image_folder / "class_01", arcname="class_01")
        tar.add(image_folder / "class_02", arcname="class_02")
    convert(archive, tmp_path / "a.lmdb", image=ImageOptions(size=16), workers=1)
    members = sorted(str(p.relative_to(image_folder)) for p in image_folder.rglob("*.jpg") if p.parent.name != "class_00")
    assert plain_names(tmp_path / "a.lmdb", "lmdb") == members
    convert([(np.full((8, 8, 3), i, np.uint8), i % 2) for i in range(4)], tmp_path / "p.blob", image=ImageOptions(size=8), workers=1)
    assert plain_names(tmp_path / "p.blob", "blob") == [f"dataset[{i}]" for i in range(4)]


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "blob"])
def test_samples_added_without_names_store_none(fmt, tmp_path):
    """A caller that adds samples without naming them (or names only some) gets no names, not wrong ones."""
    dst = tmp_path / f"d{SUFFIX[fmt]}"
    with get_writer(fmt)(dst) as writer:
        for k in range(3):
            writer.add(Encoded(k % 2, (1, 2, 2), bytes([k]) * 4))
            if k < 2:
                writer.record_source(f"x{k}")
        writer.finish(Metadata(format=fmt, count=3, shape=(1, 2, 2), channels=1, labeled=True, classes=("a", "b")))
    assert plain_names(dst, fmt) is None and open_store(dst).source_names() is None


def test_the_journal_cuts_names_back_to_the_checkpoint(tmp_path):
    """Names appended after the last checkpoint (or half written by a crash) are not durable: dropped."""
    tmp = tmp_path / "d.lmdb.partial"
    journal = Journal(tmp, {"a": 1})
    journal.start()
    rows = np.zeros(2, ROW_DTYPE)
    journal.commit(Checkpoint(2, 2, 0, [], {}), rows, ["a/1.jpg", "b/é.jpg"])
    with open(journal.folder / "names.jsonl", "ab") as handle:
        handle.write(b'"c/3.jpg"\n"d/4.j')  # after the checkpoint, the last line torn
    checkpoint = Journal(tmp, {"a": 1}).load()
    assert checkpoint is not None and checkpoint.names == ["a/1.jpg", "b/é.jpg"]
    assert (journal.folder / "names.jsonl").read_bytes().count(b"\n") == 2
    (journal.folder / "names.jsonl").write_bytes(b'"a/1.jpg"\n')  # fewer names than samples: none
    assert Journal(tmp, {"a": 1}).load().names is None


def test_names_held_in_their_stored_form_are_what_json_writes():
    """The writer keeps the names as the stored JSON array's bytes (a string per name cost several
    times its bytes for millions of documents); the array must be the one json.dumps writes and
    json.loads reads: quotes, backslashes, non-ASCII, undecodable file names (surrogate escapes)."""
    import random

    from readers.formats.names import EncodedNames, decode_source_names

    rng = random.Random(7)
    alphabet = ['a', '"', '\\', '/', '\u00e9', '\u4e2d', '\U0001f600', '\udcff', '\n', ' ', ':', ',', '[']
    for size in (0, 1, 2, 50):
        names = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(size)]
        encoded = EncodedNames()
        for name in names:
            encoded.append(name)
        stored = encoded.to_bytes()
        assert len(encoded) == size
        assert stored == json.dumps(names, ensure_ascii=True, separators=(",", ":")).encode("ascii")
        assert json.loads(stored) == names and decode_source_names(stored, size, where="t") == names
        assert EncodedNames(names).to_bytes() == stored
