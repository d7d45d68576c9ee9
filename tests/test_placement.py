"""The conversion workers write a fixed-shape blob's or HDF5 file's samples themselves, at their
inputs' places (packer/placement.py); the driving process only books them. The output is byte
for byte the one the driver alone writes, skipped inputs anywhere included, for any worker count;
a resumed run and a full disk in a worker behave as everywhere else."""

from __future__ import annotations

import ctypes
import errno
import multiprocessing
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import packer.engine
import packer.files as files
import packer.writers.journal as journal
from imagefiles import gradient, jpeg_bytes, write
from packer import ImageOptions, convert, parallel
from packer.cli import cli
from packer.placement import Placed, PlaceTask
from packer.preprocess.task import Encoded
from packer.writers.blob import BlobWriter
from packer.writers.hdf5 import HDF5Writer
from readers.formats import open_store
from checkpoints import interrupt_at_call
from roundtrip_checks import read_plain

FAULTS = Path(__file__).parent / "faults"
BROKEN = b"\xff\xd8 not an image"
#: The formats whose workers place samples, by suffix.
WRITERS = {"blob": BlobWriter, "h5": HDF5Writer}


def _folder(root: Path, broken_at: set[int], count: int = 40) -> Path:
    for i in range(count):
        data = BROKEN if i in broken_at else jpeg_bytes(gradient(30 + i % 7, 40, seed=i))
        write(root / f"class_{i % 2}" / f"img_{i:03d}.jpg", data)
    return root


def _booked(monkeypatch, suffix: str = "blob") -> list[type]:
    kinds: list[type] = []
    writer = WRITERS[suffix]
    real_add = writer.add

    def add(self, sample):
        kinds.append(type(sample))
        return real_add(self, sample)

    monkeypatch.setattr(writer, "add", add)
    return kinds


def _driver_writes_all(monkeypatch) -> None:
    """The writer lays the output out as for placing workers, but they are never told (as with
    ``--executor ray``): the driver writes every sample."""
    real = packer.engine._placement

    def stopped(*args):
        placement = real(*args)
        if placement is not None:
            placement.stop()

    monkeypatch.setattr(packer.engine, "_placement", stopped)


@pytest.mark.parametrize("suffix", WRITERS)
@pytest.mark.parametrize("broken_at, size", [(set(), 12), ({0}, 12), ({5}, 12), ({6, 7, 30}, 12), ({39}, 12), ({37}, 128)],
                         ids=["none", "first", "one", "several", "last", "near-the-end-large"])
def test_workers_place_the_samples_and_the_output_is_the_drivers_byte_for_byte(tmp_path, monkeypatch, fixed_clock, broken_at, size,
                                                                                suffix):
    """(Large samples just before the end: a moved sample's old place lies past the last sample
    and past the index sections written after it; the output must not keep it. The workers
    write behind in steps of two pages: the large samples' pages may be dropped before they are
    moved, and read back from the disk.)"""
    monkeypatch.setattr(files, "WRITE_BEHIND_STEP", 8 << 10)
    src = _folder(tmp_path / "src", broken_at)
    options = dict(image=ImageOptions(size=size))
    kinds = _booked(monkeypatch, suffix)
    placed = convert(src, tmp_path / f"placed.{suffix}", workers=2, **options)
    assert Placed in kinds  # the workers wrote samples, the driver booked them
    with monkeypatch.context() as patched:
        _driver_writes_all(patched)
        kinds.clear()
        driver = convert(src, tmp_path / f"driver.{suffix}", workers=2, **options)
    assert Placed not in kinds
    one = convert(src, tmp_path / f"one.{suffix}", workers=1, **options)  # (any worker count)
    assert placed.written == driver.written == 40 - len(broken_at)
    reference = driver.dst.read_bytes()
    assert placed.dst.read_bytes() == reference == one.dst.read_bytes()
    if suffix == "blob":  # the blob is the same file without placement's layout too
        monkeypatch.setattr(packer.engine, "_placement", lambda *args: None)
        assert convert(src, tmp_path / f"plain.{suffix}", workers=2, **options).dst.read_bytes() == reference
    meta, samples = read_plain(placed.dst)  # numpy on the file, as docs/FORMATS.md says
    assert samples == read_plain(driver.dst)[1] == read_plain(one.dst)[1]
    assert {s["path"] for s in meta["skipped"]} == {f"class_{i % 2}/img_{i:03d}.jpg" for i in broken_at}


@pytest.mark.parametrize("suffix", WRITERS)
def test_placed_samples_are_the_pixels_of_their_inputs(tmp_path, suffix):
    """Each placed sample is its own input's pixels (checked against Pillow + numpy directly, the
    file read with numpy or h5py alone): a sample written at a neighbour's place would show here,
    not only in a byte comparison."""
    from PIL import Image

    src = _folder(tmp_path / "src", {3, 4})
    report = convert(src, tmp_path / f"out.{suffix}", image=ImageOptions(size=(30, 40), resize_mode="stretch"), workers=2)
    _meta, samples = read_plain(report.dst)
    names = open_store(report.dst).source_names()
    assert names is not None and len(names) == len(samples) == 38
    for sample, name in zip(samples, names):
        image = np.asarray(Image.open(src / name).convert("RGB").resize((40, 30), Image.BILINEAR)).transpose(2, 0, 1)
        got = np.frombuffer(sample.payload, np.uint8).reshape(sample.shape).astype(int)
        assert np.abs(got - image).mean() < 8, name  # its own image (a neighbour differs by tens of levels)


@pytest.mark.parametrize("suffix", WRITERS)
def test_a_resumed_placed_conversion_gives_the_uninterrupted_output(tmp_path, monkeypatch, fixed_clock, suffix):
    src = _folder(tmp_path / "src", {12})
    (tmp_path / "ref").mkdir()
    reference = convert(src, tmp_path / "ref" / f"out.{suffix}", image=ImageOptions(size=12), workers=2)
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    dst = tmp_path / f"out.{suffix}"
    with monkeypatch.context() as patched:
        interrupt_at_call(patched, WRITERS[suffix], "add", 25)
        with pytest.raises(KeyboardInterrupt, match="inputs are saved"):
            convert(src, dst, image=ImageOptions(size=12), workers=2)
    report = convert(src, dst, image=ImageOptions(size=12), workers=2, resume=True)
    assert report.resumed > 0
    if suffix == "blob":
        assert dst.read_bytes() == reference.dst.read_bytes()
    else:  # HDF5 places its structures anew when a file is reopened: the same samples, read by h5py
        assert read_plain(dst) == read_plain(reference.dst)


@pytest.mark.parametrize("suffix", WRITERS)
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES])
def test_a_workers_failed_write_is_one_clear_line_and_leaves_nothing(tmp_path, image_folder, monkeypatch, code, suffix):
    monkeypatch.setattr(parallel, "pool_context", lambda: multiprocessing.get_context("spawn"))  # see tests/faults
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAULTS), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("PACKER_TEST_PLACE_ERRNO", str(code))
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(out / f"o.{suffix}"), "--size", "8", "-q", "-j", "2"])
    assert result.exit_code == 1, result.output
    expected = {errno.ENOSPC: "no space left on the device", errno.EACCES: "check the folder's permissions"}[code]
    assert expected in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert os.listdir(out) == []  # no DST, no DST.partial, no journal


SCRIPT = """
import numpy as np
from packer import ImageOptions, convert

class Tiles:  # defined in the script's __main__: the workers must import the script to unpickle it
    def __len__(self):
        return 12
    def __getitem__(self, i):
        if i == 4:
            raise ValueError("no tile 4")
        return np.full((10, 14, 3), i * 20, np.uint8), i % 3

if __name__ == "__main__":
    report = convert(Tiles(), {dst!r}, image=ImageOptions(size=8), workers=2)
    print(report.written)
"""


def test_a_python_dataset_defined_in_a_script_is_placed_by_the_workers(tmp_path):
    """The placing work unit passes on its task's need for the script's __main__ (the pool
    re-imports the script in the workers only then): a dataset class defined there converts."""
    import subprocess
    import sys

    dst = tmp_path / "tiles.blob"
    script = tmp_path / "make_tiles.py"
    script.write_text(SCRIPT.format(dst=str(dst)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "11"
    _meta, samples = read_plain(dst)
    assert [s.payload[0] for s in samples] == [i * 20 for i in range(12) if i != 4]


HOLDER = """
import os, sys, time
from packer.placement import PlaceTask
from packer.preprocess.task import Encoded
task = PlaceTask(lambda item: Encoded(0, (3, 2, 2), bytes(12)), sys.argv[1], 12, (3, 2, 2))
task._driver = -1  # as in a worker: the descriptor (and its shared lock) stays open
task((10**6, None, 4096 + 12 * 10**6))  # a first write far past the data
print("holding", flush=True)
time.sleep(float(sys.argv[2]))
os.pwrite(task._fd, b"\\xff" * 432, int(sys.argv[3]))  # a late worker's sample, just past the checkpoint
"""


def _interrupted(src: Path, dst: Path, monkeypatch) -> None:
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    with monkeypatch.context() as patched:
        interrupt_at_call(patched, WRITERS[dst.suffix[1:]], "add", 20)
        with pytest.raises(KeyboardInterrupt, match="inputs are saved"):
            convert(src, dst, image=ImageOptions(size=12), workers=2)


def _next_place(partial: Path) -> int:
    """The file offset of the next sample's place (12x12x3, no skip before it)."""
    saved = journal.saved_inputs(partial)
    if partial.name.endswith(".blob.partial"):
        return 4096 + saved * 432
    import h5py

    with h5py.File(partial, "r", locking=False) as file:  # row ``saved``'s chunk, allocated up front
        return file["images"].id.get_chunk_info_by_coord((saved, 0, 0, 0)).byte_offset


def _hold(partial: Path, seconds: float):
    import subprocess
    import sys

    offset = _next_place(partial)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(partial), str(seconds), str(offset)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    return holder


@pytest.mark.parametrize("suffix", WRITERS)
def test_a_resume_waits_for_the_killed_runs_workers_to_stop_writing(tmp_path, monkeypatch, fixed_clock, suffix):
    """Workers of a killed driver go on writing into DST.partial (found by a second read of the
    change: a resumed, finished blob had five wrong samples). Each holds a shared lock on the
    file while it may write; a resume waits for them before it cuts the file back."""
    src = _folder(tmp_path / "src", {30})
    (tmp_path / "ref").mkdir()
    reference = convert(src, tmp_path / "ref" / f"out.{suffix}", image=ImageOptions(size=12), workers=2)
    dst = tmp_path / f"out.{suffix}"
    _interrupted(src, dst, monkeypatch)
    holder = _hold(dst.with_name(f"out.{suffix}.partial"), 2.0)  # a late worker of the "killed" run
    report = convert(src, dst, image=ImageOptions(size=12), workers=2, resume=True)
    assert holder.wait(10) == 0
    assert report.resumed > 0
    assert read_plain(dst) == read_plain(reference.dst)  # its late write went before the resume, not into the output
    if suffix == "blob":
        assert dst.read_bytes() == reference.dst.read_bytes()


@pytest.mark.parametrize("suffix", WRITERS)
def test_a_resume_gives_up_on_workers_that_never_stop_and_keeps_the_checkpoint(tmp_path, monkeypatch, suffix):
    import packer.placement

    src = _folder(tmp_path / "src", set())
    dst = tmp_path / f"out.{suffix}"
    _interrupted(src, dst, monkeypatch)
    partial = dst.with_name(f"out.{suffix}.partial")
    saved = journal.saved_inputs(partial)
    holder = _hold(partial, 60.0)
    try:
        monkeypatch.setattr(packer.placement, "WRITERS_WAIT_SECONDS", 0.5)
        with pytest.raises(packer.errors.OutputError, match="still writing into it.*--resume again"):
            convert(src, dst, image=ImageOptions(size=12), workers=2, resume=True)
    finally:
        holder.kill()
        holder.wait()
    assert partial.exists() and journal.saved_inputs(partial) == saved  # nothing lost
    report = convert(src, dst, image=ImageOptions(size=12), workers=2, resume=True)
    assert report.resumed == saved and report.written == 40


SLOW_FIRST = """
import sys, time
from packer.placement import PlaceTask
from packer.preprocess.task import Encoded

def slow(item):
    print("converting", flush=True)
    time.sleep(1.5)  # decoding its first input when the driver was killed
    return Encoded(0, (3, 2, 2), bytes([0xEE]) * 12)

task = PlaceTask(slow, sys.argv[1], 12, (3, 2, 2))
task._driver = -1  # as in a worker
task((0, None, 0))
"""


def test_a_killed_runs_worker_is_waited_for_before_its_first_write(tmp_path):
    """A worker takes its shared lock before it converts an input it may place, not at its first
    write (found by a second read of the HDF5 change): a killed run's worker still decoding its
    first input would otherwise write into the resumed run's file after the wait."""
    import subprocess
    import sys
    import time

    from packer.placement import wait_for_writers

    path = tmp_path / "out.blob.partial"
    path.write_bytes(bytes(12))
    worker = subprocess.Popen([sys.executable, "-c", SLOW_FIRST, str(path)], stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline().strip() == "converting"
    fd = os.open(path, os.O_RDWR)
    try:
        started = time.monotonic()
        wait_for_writers(fd, str(path))  # the resumed run's wait
        waited = time.monotonic() - started
        os.pwrite(fd, bytes([0x11]) * 12, 0)  # the resumed run writes its sample 0
    finally:
        os.close(fd)
    assert worker.wait(10) == 0
    assert path.read_bytes() == bytes([0x11]) * 12, f"overwritten by the killed run's worker after a wait of {waited:.2f} s"


def test_a_write_error_the_write_behind_sees_comes_back_with_the_sample(tmp_path, monkeypatch):
    """A worker's ``sync_file_range`` that reports EIO (a sample written earlier did not reach
    the disk) makes the record an error, as a failed ``pwrite`` does: the driver then stops with
    its one line (test above), where the checkpoint's ``fsync`` might never have been told."""
    calls = []

    def failing(fd, start, length, flags):
        calls.append(flags)
        ctypes.set_errno(errno.EIO)
        return -1

    real = files._libc
    monkeypatch.setattr(files, "_libc", lambda name, argtypes: failing if name == "sync_file_range" else real(name, argtypes))
    if not sys.platform.startswith("linux"):
        pytest.skip("sync_file_range is Linux's")
    path = tmp_path / "out.blob"
    path.write_bytes(bytes(4 * 12288))
    task = PlaceTask(lambda item: Encoded(7, (3, 64, 64), bytes([item]) * 12288), str(path), 12288, (3, 64, 64), 4096)
    task._driver = -1  # this process stands in for a worker (the driver writes without write-behind)
    try:
        first = task((0, 1, 0))
    finally:
        if task._fd >= 0:
            os.close(task._fd)  # (and its shared lock)
    assert calls and isinstance(first, Placed) and first.error is not None and first.error[0] == errno.EIO
    assert path.read_bytes()[:12288] == bytes([1]) * 12288  # written; its write-out is what failed


def test_hdf5_checkpoints_sync_through_the_descriptor_open_before_the_workers_wrote(tmp_path, monkeypatch):
    """The kernel tells a write error a worker's write-behind saw first only to descriptors
    opened before it was seen: a checkpoint's ``fsync`` through one opened for it would pass,
    and the journal would record samples the disk never got (packer/writers/hdf5.py)."""
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 1e9)
    monkeypatch.setattr(journal, "BACKGROUND_CHECKPOINT_BYTES", 1)  # a checkpoint after every sample
    opened = []
    locate = HDF5Writer._locate_rows
    monkeypatch.setattr(HDF5Writer, "_locate_rows", lambda self, rows: (locate(self, rows), opened.append(self._fd))[0])
    in_durable, synced = [], []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (in_durable and synced.append(fd), real_fsync(fd))[1])
    durable = HDF5Writer._durable
    monkeypatch.setattr(HDF5Writer, "_durable", lambda self: (in_durable.append(1), durable(self), in_durable.clear())[1])
    report = convert(_folder(tmp_path / "src", set(), count=12), tmp_path / "out.h5", image=ImageOptions(size=12), workers=2)
    assert report.written == 12 and len(opened) == 1 and opened[0] >= 0
    assert synced and all(fd == opened[0] for fd in synced), (synced, opened)
