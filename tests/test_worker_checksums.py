"""Each sample's checksum is computed where the sample is made (in the conversion worker) and
travels with it, so the one writing process does not compute it (issue 16, item 1)."""

from __future__ import annotations

import dataclasses
import pickle
import struct
import zlib

import lmdb
import numpy as np
import pytest

from packer import ImageOptions, convert
from packer.preprocess.task import Encoded
from packer.writers import get_writer
from packer.writers.webdataset.tar import ShardFile
from readers.formats.lmdb import CHECKSUMS_KEY


def crc(label: int, shape: tuple[int, ...], payload: bytes) -> int:
    """docs/FORMATS.md: CRC-32 of <q label, <q each dimension, then the payload (zlib directly)."""
    return zlib.crc32(payload, zlib.crc32(struct.pack(f"<{1 + len(shape)}q", label, *shape)))


def test_a_sample_carries_its_checksum_from_where_it_was_made():
    sample = Encoded(3, (1, 2, 2), b"\x01\x02\x03\x04")
    assert sample.checksum == crc(3, (1, 2, 2), b"\x01\x02\x03\x04")
    object.__setattr__(sample, "checksum", 12345)  # as if computed elsewhere: pickling keeps it, never recomputes
    assert pickle.loads(pickle.dumps(sample)).checksum == 12345
    relabelled = dataclasses.replace(sample, label=4)  # a new sample: its own checksum
    assert relabelled.checksum == crc(4, (1, 2, 2), b"\x01\x02\x03\x04")


def test_the_stored_checksums_are_the_workers(image_folder, tmp_path):
    """A conversion with worker processes stores, for every sample, the CRC of its label, shape
    and payload as read back with lmdb and recomputed with zlib (docs/FORMATS.md)."""
    dst = tmp_path / "out.lmdb"
    convert(image_folder, dst, image=ImageOptions(size=8), workers=2)
    env = lmdb.open(str(dst), readonly=True, lock=False, subdir=dst.is_dir())
    with env.begin() as txn:
        stored = np.frombuffer(txn.get(CHECKSUMS_KEY), "<u4").tolist()
        values = [txn.get(b"%010d" % i) for i in range(len(stored))]
    env.close()
    recomputed = []
    for value in values:
        label, height, width, channels, _reserved = struct.unpack_from("<iIIHH", value)
        recomputed.append(crc(label, (channels, height, width), value[16:]))
    assert len(stored) == 18 and stored == recomputed


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "blob"])
def test_each_writer_stores_the_carried_checksum_without_recomputing(fmt, tmp_path):
    sample = Encoded(1, (3, 4, 4), bytes(48))
    object.__setattr__(sample, "checksum", 12345)  # not the CRC of its bytes: only a writer that uses it stores it
    writer = get_writer(fmt)(tmp_path / f"out.{fmt}")
    try:
        writer.add(sample)
        assert list(writer.checksums) == [12345]
    finally:
        writer.abort()


def test_webdataset_shards_store_the_carried_checksum(tmp_path):
    sample = Encoded(1, (3, 4, 4), bytes(48))
    object.__setattr__(sample, "checksum", 12345)
    shard = ShardFile(str(tmp_path), "shard-000000.tar", "raw")
    shard.add(0, sample)
    assert shard.rows[-1][-1] == 12345
    shard.close()


def test_a_sample_pickled_without_a_checksum_gets_one_when_unpickled():
    """A worker running a packer that did not carry checksums (an older version on a Ray node)."""
    sample = Encoded(2, (1, 1, 3), b"abc")
    state = {k: v for k, v in vars(sample).items() if k != "checksum"}
    old = Encoded.__new__(Encoded)
    old.__setstate__(state)
    assert old.checksum == crc(2, (1, 1, 3), b"abc")


@pytest.mark.parametrize("size", [0, 1, 15, 16, 63, 64, 4095, 150_528, 1_000_003])
def test_the_fast_crc_is_zlibs_crc(size):
    """readers.checksums computes with zlib-ng (a dependency, vectorised): the same CRC-32 as
    Python's zlib on any length and any start value, so datasets written with either agree."""
    from readers import checksums

    zlib_ng = pytest.importorskip("zlib_ng.zlib_ng")
    assert checksums._crc32 is zlib_ng.crc32  # the fast one is in use where installed
    payload = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    for start in (0, 1, 0xDEADBEEF):
        assert checksums._crc32(payload, start) == zlib.crc32(payload, start)
    assert checksums.sample_checksum(7, (3, 224, 224), memoryview(payload)) == crc(7, (3, 224, 224), payload)
