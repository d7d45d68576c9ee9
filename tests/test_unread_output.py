"""The ``packer`` command when its output cannot be written (packer/launch.py, ``_Unread``): a
reader gone (``packer convert ... 2>&1 | head -1``) does not stop a conversion; a failed write
(a full disk) fails a command that succeeded, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from readers import open_dataset

from imagefiles import gradient, jpeg_bytes, write

PACKER = [sys.executable, "-m", "packer"]


@pytest.fixture
def folder_with_warnings(tmp_path: Path) -> Path:
    """60 images in two classes, then 12 files that are not images: a warning each."""
    src = tmp_path / "src"
    for i in range(60):
        write(src / f"c{i % 2}" / f"{i:03d}.jpg", jpeg_bytes(gradient(40, 48, seed=i)))
    for i in range(12):
        write(src / "c0" / f"bad{i:02d}.jpg", b"not an image")
    return src


def test_a_conversion_goes_on_when_the_reader_of_its_output_is_gone(folder_with_warnings: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out.blob"
    run = subprocess.Popen([*PACKER, "convert", str(folder_with_warnings), str(dst), "--size", "32", "--workers", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    first = run.stdout.readline()  # then close the pipe, as `| head -1` does
    run.stdout.close()
    assert run.wait(timeout=120) == 0, first
    assert first.startswith(b"warning: skipped")
    dataset = open_dataset(dst)  # the whole conversion, as with a reader
    assert len(dataset) == 60
    assert [s.path for s in dataset.meta.skipped] == [f"c0/bad{i:02d}.jpg" for i in range(12)]
    assert np.asarray(dataset[59][0]).shape == (3, 32, 32)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_that_cannot_be_written_fails_the_command_in_one_line(folder_with_warnings: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out.lmdb"
    with open("/dev/full", "w") as full:
        done = subprocess.run([*PACKER, "convert", str(folder_with_warnings), str(dst), "--size", "32", "--workers", "1",
                               "-q"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
        assert done.returncode == 1
        assert done.stderr.strip() == ("Error: could not write to stdout (No space left on device); the command ran to its "
                                       "end, what it printed there is lost")
        assert len(open_dataset(dst)) == 60  # (it did)
        info = subprocess.run([*PACKER, "info", "--json", str(dst)], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    assert info.returncode == 1 and "Traceback" not in info.stderr
    assert info.stderr.count("\n") == 1 and "could not write to stdout" in info.stderr
    refused = subprocess.run([*PACKER, "info", str(tmp_path / "missing.lmdb")], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, timeout=120)
    assert refused.returncode == 1 and refused.stderr.startswith("Error: ")  # (its own error, unchanged)


def test_a_name_with_a_newline_prints_as_one_line(tmp_path: Path) -> None:
    """A file named 'bad\\nwarning: skipped fake.jpg: x.jpg' printed raw made a second line that
    read as a warning of its own, in the warnings, packer info and the error (a walkthrough)."""
    src = tmp_path / "src"
    write(src / "b" / "good.jpg", jpeg_bytes(gradient(16, 16)))
    write(src / "b" / "bad\nwarning: skipped fake.jpg: x.jpg", b"not an image")
    dst = tmp_path / "out.lmdb"
    done = subprocess.run([*PACKER, "convert", str(src), str(dst), "--size", "8", "--workers", "1"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["warning: skipped b/bad\\nwarning: skipped fake.jpg: x.jpg: not a readable image "
                                        "(cannot identify image file)"]
    info = subprocess.run([*PACKER, "info", str(dst)], capture_output=True, text=True, timeout=120)
    assert info.stdout.splitlines()[-1] == "    b/bad\\nwarning: skipped fake.jpg: x.jpg: not a readable image (cannot identify image file)"
    failed = subprocess.run([*PACKER, "convert", str(src), str(tmp_path / "f.lmdb"), "--size", "8", "--workers", "1",
                             "--on-error", "fail", "-q"], capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and len(failed.stderr.splitlines()) == 1
    assert failed.stderr.startswith("Error: ") and "bad\\nwarning: skipped fake.jpg" in failed.stderr
    assert open_dataset(dst).meta.skipped[0].path == "b/bad\nwarning: skipped fake.jpg: x.jpg"  # (stored as it is)
