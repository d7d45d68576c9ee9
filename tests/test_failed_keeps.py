"""A fresh run that fails at its output (a full disk) or at an input (--on-error fail) once it has
saved a checkpoint keeps it, says so, and --resume finishes it: a disk full at 90% dropped every
checkpoint (a fault sweep), and a resumed run's failure did not say the checkpoint was kept."""

from __future__ import annotations

import errno
import os
import re
import shutil

import pytest
from click.testing import CliRunner

from packer import ImageOptions, convert
from packer.cli import cli
from packer.writers import journal
from packer.writers.blob import BlobWriter
from packer.writers.hdf5 import HDF5Writer
from packer.writers.lmdb import LMDBWriter
from readers.formats import open_store

#: The lowest-level write of each format, and the call that fails (LMDB commits at each checkpoint).
WRITES = {".lmdb": (LMDBWriter, "_flush", 3), ".blob": (BlobWriter, "_write", 8), ".h5": (HDF5Writer, "_write_row", 8)}


def same_samples(a_path, b_path) -> None:
    a, b = open_store(a_path), open_store(b_path)
    assert len(a) == len(b) and [a.read(i)[1] for i in range(len(a))] == [b.read(i)[1] for i in range(len(b))]
    assert all((a.read(i)[0] == b.read(i)[0]).all() for i in range(len(a)))
    assert a.stored_checksums().tolist() == b.stored_checksums().tolist()


@pytest.mark.parametrize("suffix", sorted(WRITES))
def test_a_full_disk_keeps_the_checkpoint_and_resume_finishes(tmp_path, image_folder, monkeypatch, suffix):
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)  # a checkpoint after every input
    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    cls, name, at = WRITES[suffix]
    original, calls = getattr(cls, name), {"n": 0}

    def full(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, full)
    dst = tmp_path / f"out{suffix}"
    args = ["convert", str(image_folder), str(dst), "--size", "8", "-q", "-j", "1"]
    failed = CliRunner().invoke(cli, args)
    assert failed.exit_code == 1 and "Traceback" not in failed.output, failed.output
    line = failed.stderr.strip()
    assert line.startswith(f"Error: {dst}: no space left on the device") and " of 18 inputs are saved: " in line, line
    assert line.endswith("once that is fixed, run the same command with --resume to finish (or with --overwrite to start over)")
    assert not dst.exists() and (tmp_path / f"{dst.name}.partial").exists()
    assert "--resume" in CliRunner().invoke(cli, args).output  # a plain re-run does not start over
    monkeypatch.setattr(cls, name, original)
    done = CliRunner().invoke(cli, [*args, "--resume"])
    assert done.exit_code == 0, done.output
    convert(image_folder, tmp_path / f"whole{suffix}", image=ImageOptions(size=8), workers=1)
    same_samples(dst, tmp_path / f"whole{suffix}")
    assert sorted(os.listdir(tmp_path)) == sorted([dst.name, f"whole{suffix}"])


def test_a_bad_input_with_on_error_fail_keeps_the_checkpoint(tmp_path, image_folder, monkeypatch):
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    src = tmp_path / "src"
    shutil.copytree(image_folder, src)
    (src / "class_02" / "zzz.jpg").write_bytes(b"not a jpeg")  # the last input
    dst = tmp_path / "d.lmdb"
    args = ["convert", str(src), str(dst), "--size", "8", "-j", "1", "-q", "--on-error"]
    failed = CliRunner().invoke(cli, [*args, "fail"])
    assert failed.exit_code == 1, failed.output
    assert "zzz.jpg" in failed.stderr and re.search(r"; \d+ of 19 inputs are saved: run the same command with --resume --on-error skip to finish without it ", failed.stderr), failed.stderr
    done = CliRunner().invoke(cli, [*args, "skip", "--resume"])
    assert done.exit_code == 0, done.output
    convert(src, tmp_path / "f.lmdb", image=ImageOptions(size=8), workers=1, on_error="skip")
    same_samples(dst, tmp_path / "f.lmdb")


def test_nothing_written_still_leaves_nothing(tmp_path, monkeypatch):
    """Every input bad: no sample, so no checkpoint worth keeping (as before)."""
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i in range(3):
        (src / f"{i}.jpg").write_bytes(b"not a jpeg")
    failed = CliRunner().invoke(cli, ["convert", str(tmp_path / "src"), str(tmp_path / "o.lmdb"), "--size", "8", "-j", "1", "-q"])
    assert failed.exit_code == 1 and "none of the 3 images could be converted" in failed.output, failed.output
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_a_close_that_fails_as_the_run_is_kept_leaves_the_one_line(tmp_path, image_folder, monkeypatch):
    """The blob's buffered close flushed into the full disk: its OSError replaced the one-line
    error in a 45-line traceback (a review)."""
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    original, calls = BlobWriter._write, {"n": 0}

    def full(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 8:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(self, *args, **kwargs)

    def close_into_a_full_disk(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(BlobWriter, "_write", full)
    monkeypatch.setattr(BlobWriter, "_close", close_into_a_full_disk)
    failed = CliRunner().invoke(cli, ["convert", str(image_folder), str(tmp_path / "o.blob"), "--size", "8", "-q", "-j", "1", "--encoding", "png"])
    assert failed.exit_code == 1 and "Traceback" not in failed.output, failed.output
    assert " of 18 inputs are saved: once that is fixed" in failed.stderr and len(failed.stderr.strip().splitlines()) == 1
