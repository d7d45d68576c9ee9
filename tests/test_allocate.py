"""The blob and HDF5 writers allocate the disk blocks of every sample their workers will write
before the first is written (``packer.files.allocate``; docs/SCALING.md says why): the
kernel shows the blocks (``st_blocks``) as the workers start; the output is the same file; what
skipped inputs left unused is given back; where the filesystem cannot, nothing changes; a full
disk at that point is the usual one-line error, nothing left, a resumed run's checkpoint kept."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

import packer.engine
import packer.writers.journal as journal
from checkpoints import interrupt_at_call
from imagefiles import gradient, jpeg_bytes, write
from packer import ImageOptions, convert
from packer.cli import cli
from packer import files
from packer.writers import blob as blob_writer, hdf5 as hdf5_writer
from packer.writers.blob import BlobWriter
from packer.writers.hdf5 import HDF5Writer
from readers.formats import open_store
from readers.formats.hdf5 import IMAGES
from readers.formats.hdf5_rows import chunk_starts
from roundtrip_checks import read_plain

WRITERS = {"blob": (BlobWriter, blob_writer), "h5": (HDF5Writer, hdf5_writer)}
SIZE = 12
SAMPLE = 3 * SIZE * SIZE
MIB = 1 << 20


def _folder(root: Path, broken_at: set[int] = frozenset(), count: int = 40) -> Path:
    for i in range(count):
        data = b"\xff\xd8 not an image" if i in broken_at else jpeg_bytes(gradient(30 + i % 7, 40, seed=i))
        write(root / f"class_{i % 2}" / f"img_{i:03d}.jpg", data)
    return root


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _has_fallocate(folder: Path) -> bool:
    fd = os.open(folder / "probe", os.O_RDWR | os.O_CREAT)
    try:
        return files.allocate(fd, 0, 4096)
    finally:
        os.close(fd)
        os.unlink(folder / "probe")


def _fake_fallocate(monkeypatch, code: int) -> None:
    """The C library's fallocate fails with ``code`` (as a filesystem without it, or a full disk)."""

    def fallocate(fd, mode, offset, length):
        ctypes.set_errno(code)
        return -1

    real = files._libc
    monkeypatch.setattr(files, "_libc", lambda name, argtypes: fallocate if name == "fallocate" else real(name, argtypes))


def test_allocate_reserves_the_blocks_and_keeps_what_is_there(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"head")
    fd = os.open(path, os.O_RDWR)
    try:
        if not files.allocate(fd, 4096, 8 * MIB):
            pytest.skip("this filesystem has no fallocate")
        assert os.fstat(fd).st_size == 4096 + 8 * MIB  # the file reaches over the range
        assert _allocated(path) >= 8 * MIB  # the kernel allocated the blocks (the file had 4 bytes)
        assert files.allocate(fd, 0, 4096)  # over what is there: kept
        assert os.pread(fd, 8, 0) == b"head\0\0\0\0"
        assert os.pread(fd, 4096, 4096 + 4 * MIB) == bytes(4096)  # not written yet: zeros
    finally:
        os.close(fd)


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL])
def test_allocate_where_the_filesystem_cannot_changes_nothing(tmp_path, monkeypatch, code):
    _fake_fallocate(monkeypatch, code)
    path = tmp_path / "f"
    path.write_bytes(b"head")
    fd = os.open(path, os.O_RDWR)
    try:
        assert files.allocate(fd, 4096, MIB) is False
    finally:
        os.close(fd)
    assert path.read_bytes() == b"head"


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
def test_allocate_on_a_full_disk_raises(tmp_path, monkeypatch, code):
    _fake_fallocate(monkeypatch, code)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        with pytest.raises(OSError) as raised:
            files.allocate(fd, 0, MIB)
    finally:
        os.close(fd)
    assert raised.value.errno == code


def test_allocate_on_a_real_full_tmpfs_raises_enospc(tmp_path):
    """The kernel's own answer, on a tmpfs of 1 MiB asked for 4 (needs root to mount it)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        fd = os.open(disk / "f", os.O_RDWR | os.O_CREAT)
        try:
            with pytest.raises(OSError) as raised:
                files.allocate(fd, 0, 4 * MIB)
            assert raised.value.errno == errno.ENOSPC
        finally:
            os.close(fd)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _watch_placement(monkeypatch) -> list[tuple[int, int]]:
    """(allocated bytes, size) of ``DST.partial`` as the workers are handed the placement."""
    seen: list[tuple[int, int]] = []
    real = packer.engine._placement

    def watched(writer, *args):
        placement = real(writer, *args)
        if placement is not None:
            stat = os.stat(placement.path)
            seen.append((stat.st_blocks * 512, stat.st_size))
        return placement

    monkeypatch.setattr(packer.engine, "_placement", watched)
    return seen


@pytest.mark.parametrize("suffix", WRITERS)
@pytest.mark.parametrize("broken_at", [set(), {198, 199}], ids=["none", "a-middle-and-the-last"])  # (class_0, then class_1)
def test_the_workers_places_are_allocated_first_and_the_output_is_the_same(tmp_path, monkeypatch, fixed_clock, suffix, broken_at):
    """200 rows: HDF5 puts chunk index nodes between the chunks every few dozen rows."""
    if not _has_fallocate(tmp_path):
        pytest.skip("this filesystem has no fallocate")
    count = 200
    src = _folder(tmp_path / "src", broken_at, count)
    options = dict(image=ImageOptions(size=SIZE), workers=2)
    with monkeypatch.context() as patched:
        patched.setattr(WRITERS[suffix][1], "allocate", lambda fd, offset, length: False)
        plain = convert(src, tmp_path / f"plain.{suffix}", **options)
    seen = _watch_placement(monkeypatch)
    report = convert(src, tmp_path / f"out.{suffix}", **options)
    assert len(seen) == 1
    allocated, size = seen[0]
    assert allocated >= count * SAMPLE and size >= count * SAMPLE  # every input's place, before any was written
    assert report.dst.read_bytes() == plain.dst.read_bytes()
    assert report.written == count - len(broken_at)
    if suffix == "h5":  # the case the span covers: chunks not all back to back
        with h5py.File(report.dst, "r") as f:
            starts = chunk_starts(f[IMAGES].id, report.written, SAMPLE)
        assert starts is not None and np.any(np.diff(np.sort(starts)) != SAMPLE)
    # nothing kept past the data: the places of skipped inputs are given back (4 KiB blocks)
    assert _allocated(report.dst) <= -(-report.dst.stat().st_size // 4096) * 4096
    assert len(open_store(report.dst)) == report.written


def _full(fd, offset, length):
    """A full disk, after part of the range was allocated (as fallocate may leave it)."""
    os.ftruncate(fd, max(os.fstat(fd).st_size, offset + length // 2))
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("suffix", WRITERS)
def test_a_full_disk_at_the_allocation_is_one_line_and_leaves_nothing(tmp_path, image_folder, monkeypatch, suffix):
    monkeypatch.setattr(WRITERS[suffix][1], "allocate", _full)
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(out / f"o.{suffix}"), "--size", "8", "-q", "-j", "2"])
    assert result.exit_code == 1, result.output
    assert "no space left on the device" in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert os.listdir(out) == []


@pytest.mark.parametrize("suffix", WRITERS)
def test_a_full_disk_at_a_resumed_runs_allocation_keeps_its_checkpoint(tmp_path, monkeypatch, fixed_clock, suffix):
    """200 inputs: what HDF5 gives back spares the chunk index nodes between the chunks."""
    src = _folder(tmp_path / "src", count=200)
    (tmp_path / "ref").mkdir()
    reference = convert(src, tmp_path / "ref" / f"out.{suffix}", image=ImageOptions(size=SIZE), workers=2)
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    dst = tmp_path / f"out.{suffix}"
    with monkeypatch.context() as patched:
        interrupt_at_call(patched, WRITERS[suffix][0], "add", 90)
        with pytest.raises(KeyboardInterrupt, match="inputs are saved"):
            convert(src, dst, image=ImageOptions(size=SIZE), workers=2)
    saved = journal.saved_inputs(Path(f"{dst}.partial"))
    assert saved and saved > 0
    with monkeypatch.context() as patched:
        patched.setattr(WRITERS[suffix][1], "allocate", _full)
        result = CliRunner().invoke(cli, ["convert", str(src), str(dst), "--size", str(SIZE), "-q", "-j", "2", "--resume"])
    assert result.exit_code == 1 and "no space left" in result.stderr, result.output
    assert journal.saved_inputs(Path(f"{dst}.partial")) == saved  # the progress is kept
    if suffix == "blob":  # cut back to the checkpoint's samples (HDF5: the rows after it punched)
        assert Path(f"{dst}.partial").stat().st_size == 4096 + saved * SAMPLE
    report = convert(src, dst, image=ImageOptions(size=SIZE), workers=2, resume=True)
    assert report.resumed == saved
    if suffix == "blob":
        assert dst.read_bytes() == reference.dst.read_bytes()
    else:  # HDF5 places its structures anew when a file is reopened: the same samples
        assert [bytes(s.payload) for s in read_plain(dst)[1]] == [bytes(s.payload) for s in read_plain(reference.dst)[1]]
        assert len(read_plain(dst)[1]) == 200
