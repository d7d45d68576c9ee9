"""Runs of samples written past the page cache in pieces (packer/direct_writes.py), and the
placing workers that use them (packer/placement.py)."""

from __future__ import annotations

import errno
import mmap
import os
import random

import pytest

from packer import direct_writes
from packer.direct_writes import DirectRuns, open_direct
from packer.placement import Placed, PlaceTask
from packer.preprocess.task import Encoded

PAGE = mmap.PAGESIZE


def _writer(path, piece, direct=True):
    fd = os.open(path, os.O_WRONLY)
    return fd, DirectRuns(fd, open_direct(str(path)) if direct else -1, piece)


@pytest.mark.parametrize("piece", [PAGE, 3 * PAGE, 1 << 20])
@pytest.mark.parametrize("stride", [512, 3000, 3 * 224 * 224])
def test_runs_land_byte_for_byte_whatever_their_alignment(tmp_path, piece, stride):
    """Runs of consecutive samples (a chunk's), starting anywhere, some sharing a page with the
    next run, written in pieces: the file holds exactly what plain writes would have put there,
    and nothing else was touched."""
    rng = random.Random(stride + piece)
    count = 200
    path = tmp_path / "out.bin"
    expected = bytearray(rng.randbytes(count * stride + 777))  # what was there before: kept where no sample goes
    path.write_bytes(expected)
    fd, runs = _writer(path, piece)
    try:
        order = list(range(0, count, 7))
        rng.shuffle(order)
        for first in order:  # runs of 7 samples, in any order, each finished as a chunk is
            for index in range(first, min(first + 7, count)):
                if index == first + 3 and rng.random() < 0.3:
                    continue  # a failed input: its place is left as it was
                sample = rng.randbytes(stride)
                runs.write(sample, 333 + index * stride)
                expected[333 + index * stride:333 + (index + 1) * stride] = sample
            runs.finish()
    finally:
        runs.close()
        os.close(fd)
    assert path.read_bytes() == bytes(expected)


def test_whole_pages_go_past_the_page_cache_and_part_pages_through_it(tmp_path, monkeypatch):
    """Every write through the ``O_DIRECT`` descriptor is whole pages at a page boundary (the
    device refuses anything else) and at most a piece; only a run's part-pages at its two ends
    go through the page cache."""
    seen = []
    real = os.pwrite

    def spy(fd, data, offset):
        seen.append((fd, offset, len(data)))
        return real(fd, data, offset)

    monkeypatch.setattr(direct_writes.os, "pwrite", spy)
    path = tmp_path / "out.bin"
    path.write_bytes(bytes(64 * PAGE))
    fd, runs = _writer(path, 4 * PAGE)
    if runs.direct < 0:
        pytest.skip("this filesystem refuses O_DIRECT")
    try:
        for index in range(20):
            runs.write(bytes([index + 1]) * 3000, 100 + index * 3000)
        runs.finish()
    finally:
        runs.close()
        os.close(fd)
    direct = [(offset, length) for f, offset, length in seen if f != fd]
    buffered = [(offset, length) for f, offset, length in seen if f == fd]
    assert direct and all(offset % PAGE == 0 and length % PAGE == 0 and 0 < length <= 4 * PAGE for offset, length in direct)
    end = 100 + 20 * 3000
    assert buffered == [(100, PAGE - 100), (end - end % PAGE, end % PAGE)]
    assert sum(length for _o, length in direct + buffered) == 20 * 3000
    data = path.read_bytes()
    assert all(data[100 + i * 3000:100 + (i + 1) * 3000] == bytes([i + 1]) * 3000 for i in range(20))


def test_a_refused_direct_write_goes_through_the_page_cache(tmp_path, monkeypatch):
    """A filesystem that opens with ``O_DIRECT`` but refuses the write (``EINVAL``: an alignment
    larger than a page) gets the same bytes through the page cache."""
    real = os.pwrite
    path = tmp_path / "out.bin"
    path.write_bytes(bytes(16 * PAGE))
    fd, runs = _writer(path, 2 * PAGE, direct=False)
    runs.direct = os.open(path, os.O_WRONLY)  # stands in for the direct descriptor, refused below

    def refusing(f, data, offset):
        if f == runs.direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(f, data, offset)

    monkeypatch.setattr(direct_writes.os, "pwrite", refusing)
    try:
        runs.write(b"\x05" * (10 * PAGE + 17), 9)
        runs.finish()
    finally:
        runs.close()
        os.close(fd)
    assert path.read_bytes() == bytes(9) + b"\x05" * (10 * PAGE + 17) + bytes(16 * PAGE - 10 * PAGE - 26)


def test_a_placing_workers_failed_direct_write_comes_back_with_the_chunks_samples(tmp_path, monkeypatch):
    """A piece the device fails (EIO) makes the chunk's records errors, so the driver stops with
    its one line (tests/test_placement.py) instead of booking samples that are not on disk."""
    real = os.pwrite

    def failing(f, data, offset):
        if len(data) % PAGE == 0 and offset % PAGE == 0 and len(data) >= PAGE:
            raise OSError(errno.EIO, "Input/output error")
        return real(f, data, offset)

    monkeypatch.setattr(direct_writes.os, "pwrite", failing)
    path = tmp_path / "out.blob"
    path.write_bytes(bytes(8 * 12288))
    task = PlaceTask(lambda item: Encoded(7, (3, 64, 64), bytes([item]) * 12288), str(path), 12288, (3, 64, 64), 4096)
    task._driver = -1  # this process stands in for a worker
    try:
        records = list(task.map([(i, i + 1, i * 12288) for i in range(4)]))
    finally:
        if task._runs is not None:
            task._runs.close()
        if task._fd >= 0:
            os.close(task._fd)
    if task._runs is None:
        pytest.skip("this filesystem refuses O_DIRECT")
    assert len(records) == 4 and all(isinstance(r, Placed) and r.error is not None and r.error[0] == errno.EIO for r in records)


def test_a_placing_worker_writes_its_chunk_before_it_answers(tmp_path):
    """The records of a chunk come back only once its samples are in the file (the driver's
    checkpoint ``fsync`` then covers them), single inputs as well as chunks."""
    path = tmp_path / "out.blob"
    path.write_bytes(bytes(12 * 12288))
    task = PlaceTask(lambda item: Encoded(7, (3, 64, 64), bytes([item]) * 12288), str(path), 12288, (3, 64, 64), 4096)
    task._driver = -1
    try:
        records = []
        for record in task.map([(i, i + 1, i * 12288) for i in range(10)]):
            if not records:  # the first answer: the whole chunk is written by now
                assert path.read_bytes()[:10 * 12288] == b"".join(bytes([i + 1]) * 12288 for i in range(10))
            records.append(record)
        single = task((11, 99, 11 * 12288))
        assert path.read_bytes()[11 * 12288:] == bytes([99]) * 12288
    finally:
        if task._runs is not None:
            task._runs.close()
        if task._fd >= 0:
            os.close(task._fd)
    assert all(isinstance(r, Placed) and r.error is None for r in records + [single])
