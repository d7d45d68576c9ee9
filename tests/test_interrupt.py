"""An interrupted conversion never leaves an output that a reader accepts as complete."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from imagefiles import jpeg_bytes, write
from packer import ImageOptions, convert
from packer.cli import cli
from packer.samples import natural_image
from packer.writers.lmdb import LMDBWriter
from readers import IncompleteDatasetError, LMDBDataset
from readers.formats import open_store


@pytest.fixture(scope="module")
def slow_folder(tmp_path_factory) -> Path:
    """300 full-size JPEGs (one picture copied): about a second of work for one worker."""
    root = tmp_path_factory.mktemp("slow")
    data = jpeg_bytes(natural_image(np.random.default_rng(0), 375, 500), quality=90)
    for i in range(300):
        write(root / f"c{i % 2}" / f"{i:04d}.jpg", data)
    return root


def start(src: Path, dst: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "packer", "convert", str(src), str(dst), "--size", "64", "-j", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until_writing(dst: Path, proc: subprocess.Popen) -> None:
    partial = dst.with_name(dst.name + ".partial")
    deadline = time.time() + 60
    while not partial.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.01)
    time.sleep(0.3)


def test_sigkill_leaves_nothing_a_reader_accepts(tmp_path, slow_folder):
    dst = tmp_path / "out.lmdb"
    proc = start(slow_folder, dst)
    wait_until_writing(dst, proc)
    proc.kill()
    proc.wait()
    assert not dst.exists()
    partial = dst.with_name(dst.name + ".partial")
    with pytest.raises(IncompleteDatasetError, match="unfinished conversion"):
        open_store(dst)
    with pytest.raises(IncompleteDatasetError):
        open_store(partial)
    if partial.exists():  # even opened directly, it has no metadata record
        with pytest.raises(IncompleteDatasetError):
            LMDBDataset(partial)
    # A new run replaces the stale leftover and completes.
    convert(slow_folder, dst, image=ImageOptions(size=16), workers=2)
    assert len(LMDBDataset(dst)) == 300 and not partial.exists()


def test_ctrl_c_cleans_up_and_says_so(tmp_path, slow_folder):
    dst = tmp_path / "out.lmdb"
    proc = start(slow_folder, dst)
    wait_until_writing(dst, proc)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert f"interrupted before the first checkpoint; nothing was written to {dst}" in err and "Traceback" not in err
    assert not dst.exists() and not dst.with_name(dst.name + ".partial").exists()


def test_failure_while_writing_removes_the_partial_output(tmp_path, image_folder, monkeypatch):
    calls = {"n": 0}
    original = LMDBWriter._write

    def failing(self, index, sample):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device")
        return original(self, index, sample)

    monkeypatch.setattr(LMDBWriter, "_write", failing)
    dst = tmp_path / "full.lmdb"
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(dst), "--size", "8", "-q", "-j", "1"])
    assert result.exit_code == 1
    assert "no space left on the device" in result.stderr and "Traceback" not in result.output
    assert not dst.exists() and not dst.with_name("full.lmdb.partial").exists()


def test_an_existing_output_survives_a_failed_overwrite(tmp_path, image_folder, monkeypatch):
    dst = tmp_path / "keep.lmdb"
    convert(image_folder, dst, image=ImageOptions(size=8), workers=1)
    monkeypatch.setattr(LMDBWriter, "_write", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt, match="interrupted before the first checkpoint"):
        convert(image_folder, dst, image=ImageOptions(size=12), workers=1, overwrite=True)
    assert LMDBDataset(dst).meta.shape == (3, 8, 8)
    assert sorted(os.listdir(tmp_path)) == ["keep.lmdb"]


def test_a_hang_up_to_the_whole_process_group_ends_in_one_line(tmp_path, slow_folder):
    """A closed terminal sends SIGHUP to every process of the job, multiprocessing's resource
    tracker included: it died and printed a traceback per shared-memory block at the run's end
    (a data-safety walkthrough). It now starts with SIGHUP blocked and cleans up as usual."""
    dst = tmp_path / "out.lmdb"
    proc = subprocess.Popen([sys.executable, "-m", "packer", "convert", str(slow_folder), str(dst), "--size", "64", "-j", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_until_writing(dst, proc)
    os.killpg(proc.pid, signal.SIGHUP)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "resource_tracker" not in err, err
    assert [line for line in err.splitlines() if line.strip()][-1].startswith("Error: interrupted"), err
