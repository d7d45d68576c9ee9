"""HDF5's rows allocated up front for the workers (packer/writers/hdf5.py, ``placement``): an
error while allocating them, a finish interrupted around the cut of the unused rows, and a
resume from a journal of the older growing layout (found by a second read of the change)."""

from __future__ import annotations

import errno
import os

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

import packer.writers.journal as journal
from packer import ImageOptions, StorageOptions, convert
from packer.cli import cli
from packer.writers.hdf5 import HDF5Writer
from readers.formats import open_store
from checkpoints import interrupt_at_call
from roundtrip_checks import read_plain
from test_placement import _folder


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_an_error_allocating_the_rows_is_one_line_and_leaves_nothing(tmp_path, image_folder, monkeypatch, code):
    """HDF5 writes every row's chunk index entry when the rows are created (a large N on a
    nearly full disk: ENOSPC from H5Dcreate, seen on a 2 MiB tmpfs with 150,000 rows)."""

    def failing(self, shape, rows):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(HDF5Writer, "_create_rows", failing)
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(tmp_path / "out.h5"), "--size", "8", "-q", "-j", "1"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1, result.output
    assert os.listdir(tmp_path) == []


def _interrupt(exc_type=KeyboardInterrupt):
    def boom(*args, **kwargs):
        raise exc_type

    return boom


@pytest.mark.parametrize("where", ["index", "cut"])
@pytest.mark.parametrize("last_checkpoint", [30, 40])
def test_a_finish_interrupted_around_the_cut_resumes(tmp_path, monkeypatch, fixed_clock, where, last_checkpoint):
    """Killed after the unused rows were cut (while writing the index), or after they were
    emptied and before the cut: the resumed run gives the same samples, read by h5py and by
    packer's memory map alike."""
    src = _folder(tmp_path / "src", {5, 38, 39})
    (tmp_path / "ref").mkdir()
    reference = convert(src, tmp_path / "ref" / "out.h5", image=ImageOptions(size=12), workers=2)
    dst = tmp_path / "out.h5"
    with monkeypatch.context() as patched:
        patched.setattr(journal, "CHECKPOINT_SECONDS", 0.0)
        patched.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
        patched.setattr(HDF5Writer, "durable_in_background", property(lambda self: False))  # no deferred checkpoint
        real_progress = HDF5Writer.progress
        patched.setattr(HDF5Writer, "progress", lambda self, inputs, skipped: real_progress(self, inputs, skipped) if inputs <= last_checkpoint else None)
        if where == "index":
            patched.setattr(HDF5Writer, "_write_index", _interrupt())
        else:
            real_cut = HDF5Writer._cut_rows

            def cut(self):
                patched.setattr(h5py.Dataset, "resize", _interrupt())
                real_cut(self)

            patched.setattr(HDF5Writer, "_cut_rows", cut)
        with pytest.raises(KeyboardInterrupt):
            convert(src, dst, image=ImageOptions(size=12), workers=2)
    report = convert(src, dst, image=ImageOptions(size=12), workers=2, resume=True)
    assert report.resumed == last_checkpoint and report.written == 37, report
    assert read_plain(dst) == read_plain(reference.dst)
    with h5py.File(dst, "r") as file:
        assert np.array_equal(open_store(dst).read_batch(list(range(37)))[0], file["images"][:])


@pytest.mark.parametrize("broken", [set(), {4}])
def test_a_resume_from_a_journal_of_the_growing_layout(tmp_path, monkeypatch, fixed_clock, broken):
    """A partial file written before rows were allocated up front (its journal has no "rows")
    resumes in the layout it has."""
    src = _folder(tmp_path / "src", broken)
    (tmp_path / "ref").mkdir()
    reference = convert(src, tmp_path / "ref" / "out.h5", image=ImageOptions(size=12), workers=2)
    dst = tmp_path / "out.h5"
    with monkeypatch.context() as patched:
        patched.setattr(journal, "CHECKPOINT_SECONDS", 0.0)
        patched.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
        patched.setattr(HDF5Writer, "placement", lambda self, *args: None)
        real_sync = HDF5Writer._sync
        patched.setattr(HDF5Writer, "_sync", lambda self: {k: v for k, v in real_sync(self).items() if k != "rows"})
        interrupt_at_call(patched, HDF5Writer, "add", 25)
        with pytest.raises(KeyboardInterrupt):
            convert(src, dst, image=ImageOptions(size=12), workers=2)
    report = convert(src, dst, image=ImageOptions(size=12), workers=2, resume=True)
    assert report.resumed > 0
    assert read_plain(dst) == read_plain(reference.dst)


@pytest.mark.parametrize("storage", [None, StorageOptions(compression="gzip")], ids=["rows", "appended"])
def test_the_files_bytes_do_not_depend_on_the_machines_speed(tmp_path, monkeypatch, fixed_clock, image_folder, storage):
    """Checkpoints every few seconds put h5py's flushes where the clock said, and where they fall
    decides where HDF5 lays out its structures: the same 300 images gave files 328 bytes apart,
    converted alone or three at once (an interrupted-conversions walkthrough). A machine slow
    enough for a timed checkpoint after every input now gives the same bytes as a fast one."""
    outputs = []
    for seconds in (1e9, 0.0):  # no timed checkpoint at all; one after every input (were they timed)
        monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", seconds)
        out = tmp_path / f"out-{seconds}.h5"
        convert(image_folder, out, image=ImageOptions(size=12), storage=storage, workers=2)
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
