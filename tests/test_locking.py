"""One conversion per destination: a second one is refused with a clear error, nothing is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from packer import ImageOptions, convert
from packer.cli import cli
from packer.errors import OutputError
from packer.locking import DestinationLock, lock_path
from packer.remote import staging_folder
from packer.writers.base import partial_path
from packer.writers.lmdb import LMDBWriter
from readers import open_dataset

#: A child running ``packer ARGS`` that takes 50 ms per sample, so a second command meets it.
SLOW_CHILD = (
    "import sys, time, packer.writers.base as b; add = b.Writer.add; "
    "b.Writer.add = lambda self, s: (time.sleep(0.05), add(self, s))[1]; "
    "from packer.cli import cli; cli(sys.argv[1:])"
)


def test_a_second_writer_to_the_same_destination_is_refused(tmp_path):
    dst = tmp_path / "out.lmdb"
    first = LMDBWriter(dst)
    with pytest.raises(OutputError, match=rf"out.lmdb: another packer conversion \(pid {os.getpid()}\) is writing it now"):
        LMDBWriter(dst)
    assert partial_path(dst).exists()  # the refused one touched nothing
    first.abort()
    assert not lock_path(partial_path(dst)).exists()
    LMDBWriter(dst).abort()  # free again


def test_a_second_command_is_refused_and_the_first_finishes(image_folder, tmp_path):
    dst = tmp_path / "out.lmdb"
    args = ["convert", str(image_folder), str(dst), "-j", "1", "-q", "--size", "16"]
    first = subprocess.Popen([sys.executable, "-c", SLOW_CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lock = lock_path(partial_path(dst))
    deadline = time.time() + 60
    while not lock.exists() or not lock.read_text().strip():
        assert first.poll() is None, first.communicate()
        assert time.time() < deadline
        time.sleep(0.01)
    second = CliRunner().invoke(cli, [*args, "--overwrite"])
    assert second.exit_code != 0
    assert f"another packer conversion (pid {first.pid}) is writing it now" in second.output
    assert "Traceback" not in second.output
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert len(open_dataset(dst)) == 18 and not lock.exists()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    path = tmp_path / "x.partial-lock"
    child = subprocess.Popen(
        [sys.executable, "-c", f"import time; from packer.locking import DestinationLock; DestinationLock({str(path)!r}, 'x').acquire(); "
         "print('locked', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout.readline().strip() == "locked"
    with pytest.raises(OutputError, match=f"pid {child.pid}"):
        DestinationLock(path, "x").acquire()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert path.exists()  # the file stays, the lock does not
    DestinationLock(path, "x").acquire().release()


def test_a_url_destination_is_locked_before_it_is_checked(image_folder, tmp_path):
    url = (tmp_path / "remote" / "out").as_uri()
    (tmp_path / "remote").mkdir()
    with DestinationLock(lock_path(staging_folder(url)), url):
        with pytest.raises(OutputError, match="another packer conversion"):
            convert(image_folder, url, format="webdataset", image=ImageOptions(size=16), workers=1)
    report = convert(image_folder, url, format="webdataset", image=ImageOptions(size=16), workers=1)
    assert report.written == 18 and (tmp_path / "remote" / "out" / "packer.json").exists()
