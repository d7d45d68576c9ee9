"""A full disk or a permission error while writing: one clear line, nothing left behind, exit 1;
every format's publication syncs its files and folders; every input is counted."""

from __future__ import annotations

import errno
import multiprocessing
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from imagefiles import write
from packer import ImageOptions, StorageOptions, convert
from packer import parallel
from packer.cli import cli
from packer import files  # publish() and its syncs
from packer.writers.blob import BlobWriter
from packer.writers.hdf5 import HDF5Writer
from packer.writers.lmdb import LMDBWriter
from packer.writers.webdataset.tar import ShardFile
from packer.writers.journal import journal_path
from readers.formats import open_store

FAULTS = Path(__file__).parent / "faults"
FORMATS = ("lmdb", "hdf5", "blob", "webdataset")
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob", "webdataset": ".shards"}
#: The lowest-level write of each format, where the error is injected (HDF5: into the rows
#: allocated up front, and, compressed, into its growing dataset).
LOW_LEVEL = {
    "lmdb": (LMDBWriter, "_flush"),
    "hdf5": (HDF5Writer, "_write_row"),
    "hdf5-compressed": (HDF5Writer, "_append_fixed"),
    "blob": (BlobWriter, "_write"),
    "webdataset": (ShardFile, "_member"),
}
ERRORS = {
    errno.ENOSPC: "no space left on the device",
    errno.EACCES: "check the folder's permissions",
    errno.ENOMEM: "out of memory or address space (Cannot allocate memory); raise the limit (ulimit -v",  # it said: choose a DST
    errno.EMFILE: "too many open files (Too many open files); raise the limit (ulimit -n)",
}


@pytest.mark.parametrize("code", sorted(ERRORS))
@pytest.mark.parametrize("fmt", [*FORMATS, "hdf5-compressed"])
def test_write_error_is_one_clear_line_and_leaves_nothing(tmp_path, image_folder, monkeypatch, fmt, code):
    cls, name = LOW_LEVEL[fmt]
    original = getattr(cls, name)
    calls = {"n": 0}

    def failing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] >= 3 or fmt in ("lmdb", "hdf5-compressed"):  # those two write in a few big blocks
            raise OSError(code, os.strerror(code))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, failing)
    if fmt == "webdataset":
        # Its shards are written in the workers. A forked worker would see the patch, but fork in a
        # process with threads (earlier tests leave some) can hang on a lock held at the fork: the
        # workers are spawned instead and tests/faults/sitecustomize.py injects the same fault there.
        monkeypatch.setattr(parallel, "pool_context", lambda: multiprocessing.get_context("spawn"))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAULTS), *filter(None, [os.environ.get("PYTHONPATH")])]))
        monkeypatch.setenv("PACKER_TEST_SHARD_ERRNO", str(code))
    dst = tmp_path / f"out{SUFFIX[fmt.split('-')[0]]}"
    extra = ["--format", fmt] + (["--shard-size", "4"] if fmt == "webdataset" else [])
    if fmt == "hdf5-compressed":
        extra = ["--format", "hdf5", "--compression", "gzip"]
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(dst), "--size", "8", "-q", "-j", "1", *extra])
    assert result.exit_code == 1, result.output
    assert ERRORS[code] in result.stderr and "Traceback" not in result.output
    assert sorted(os.listdir(tmp_path)) == []  # no DST, no DST.partial, no journal


@pytest.mark.parametrize("fmt", FORMATS)
def test_publication_syncs_every_file_and_folder(tmp_path, image_folder, monkeypatch, fmt):
    synced: list[Path] = []
    original = files.fsync_path
    monkeypatch.setattr(files, "fsync_path", lambda path, *a: (synced.append(Path(path)), original(path, *a))[1])
    dst = tmp_path / "out" / f"data{SUFFIX[fmt]}"
    dst.parent.mkdir()
    storage = StorageOptions(shard_size=5) if fmt == "webdataset" else None
    convert(image_folder, dst, format=fmt, image=ImageOptions(size=8), storage=storage, workers=1)
    partial = dst.with_name(dst.name + ".partial")
    expected = {partial} if dst.is_file() else {partial, *(partial / p.name for p in dst.iterdir())}
    assert expected <= set(synced)  # data and folder synced under the temporary name ...
    assert synced[-1] == dst.parent  # ... and the folder holding the renamed entry, last


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_input_is_written_or_listed_as_skipped(tmp_path, image_folder, fmt):
    src = tmp_path / "src"
    for path in image_folder.rglob("*.jpg"):
        write(src / path.relative_to(image_folder), path.read_bytes())
    write(src / "class_00" / "broken.jpg", b"\xff\xd8 not really")
    write(src / "class_01" / "empty.png", b"")
    write(src / "stray.jpg", (image_folder / "class_00").iterdir().__next__().read_bytes())  # outside any class
    found = sum(1 for p in src.rglob("*") if p.is_file())
    storage = StorageOptions(shard_size=4) if fmt == "webdataset" else None
    report = convert(src, tmp_path / f"out{SUFFIX[fmt]}", format=fmt, image=ImageOptions(size=8), storage=storage, workers=2)
    meta = open_store(report.dst).meta
    assert report.inputs == found == 21
    assert report.written + len(report.skipped) == found
    assert meta.count + len(meta.skipped) == found and meta.count == 18
    assert {s.path for s in meta.skipped} == {"class_00/broken.jpg", "class_01/empty.png", "stray.jpg"}
    assert not journal_path(report.dst.with_name(report.dst.name + ".partial")).exists()


@pytest.mark.parametrize("disk, converts", [(1 << 20, True), (64 << 10, False)])
def test_lmdb_reserves_what_its_commits_need_not_its_map(tmp_path, image_folder, monkeypatch, disk, converts):
    """LMDB reserved its whole map (64 MiB at the start, then each half it grew by): a 420 KB
    dataset failed on a 60 MB disk with 'no space left'. A disk of ``disk`` bytes, as
    posix_fallocate sees it: the ~230 KB dataset converts on 1 MiB, and on 64 KiB fails in one line."""
    real = os.posix_fallocate

    def disk_of(fd: int, offset: int, length: int) -> None:
        if offset + length > disk:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", disk_of)
    dst = tmp_path / "out.lmdb"
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(dst), "--size", "64", "-q", "-j", "1"])
    if converts:
        assert result.exit_code == 0, result.output
        assert len(open_store(dst)) == 18 and CliRunner().invoke(cli, ["verify", str(dst)]).exit_code == 0
    else:
        assert result.exit_code == 1 and ERRORS[errno.ENOSPC] in result.stderr and "Traceback" not in result.output, result.output
        assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("writer", [BlobWriter, HDF5Writer])
def test_a_write_error_as_workers_are_given_their_places_is_one_line(tmp_path, image_folder, monkeypatch, writer):
    """The blob flushed its header page there, outside any error handling: a disk with 4 KiB
    left gave a 43-line traceback."""
    def full(self, *args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer, "placement", full)
    dst = tmp_path / f"out{'.blob' if writer is BlobWriter else '.h5'}"
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(dst), "--size", "8", "-q", "-j", "1"])
    assert result.exit_code == 1 and ERRORS[errno.ENOSPC] in result.stderr and "Traceback" not in result.output, result.output
    assert os.listdir(tmp_path) == []
