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
from packer.locking import DestinationLock, lock_holder, lock_path
from packer.remote import staging_folder
from packer.writers.base import partial_path
from packer.writers.journal import saved_inputs
from packer.writers.lmdb import LMDBWriter
from readers import open_dataset
from readers.schema import IncompleteDatasetError

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


@pytest.mark.parametrize("given", ["folder", "string", "pattern"])
def test_streaming_shards_of_a_folder_being_written_names_the_writer(tmp_path, given):
    """StreamingShards said "no such shard" of a WebDataset DST still being written, where every
    other reader names the conversion writing it (a Streaming user's walkthrough)."""
    from packer.writers.webdataset import ShardWriter
    from readers import StreamingShards

    dst = tmp_path / "shards"
    source = {"folder": dst, "string": str(dst), "pattern": str(dst / "shard-%06d.tar")}[given]
    writer = ShardWriter(dst)
    try:
        with pytest.raises(IncompleteDatasetError, match=rf"shards: does not exist yet; a packer conversion \(pid {os.getpid()}\) is writing it now"):
            StreamingShards(source)
    finally:
        writer.abort()
    with pytest.raises(FileNotFoundError):  # nothing there at all: as before
        StreamingShards(source)


def test_shards_inside_an_unfinished_conversion_are_refused_by_pattern_and_list(tmp_path):
    """StreamingShards refused DST.partial as a folder, but a brace pattern or a list of its shards
    streamed an interrupted conversion's part as a dataset (a text walkthrough): refused alike."""
    import numpy as np

    import packer
    from readers import StreamingShards

    packer.convert([(np.zeros((4, 4, 3), np.uint8), 0)] * 6, tmp_path / "out", format="webdataset", workers=1,
                   storage=packer.StorageOptions(shard_size=2))
    (tmp_path / "out").rename(tmp_path / "out.partial")  # what an interrupted run leaves: whole shards, no DST
    inside = tmp_path / "out.partial"
    for given in (str(inside / "shard-{000000..000001}.tar"), [str(inside / "shard-000000.tar")], str(inside)):
        with pytest.raises(IncompleteDatasetError, match=r"out\.partial: an unfinished conversion \(its name ends in \.partial\)"):
            StreamingShards(given)


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
    busy = f"out.lmdb: does not exist yet; a packer conversion (pid {first.pid}) is writing it now (out.lmdb.partial): wait for it to finish"
    with pytest.raises(IncompleteDatasetError) as raised:  # being written, not interrupted: no advice to resume it
        open_dataset(dst)
    assert str(raised.value) == f"{dst.parent}/{busy}"
    info = CliRunner().invoke(cli, ["info", str(dst)])
    assert info.exit_code == 1 and info.stderr == f"Error: {dst.parent}/{busy}\n"
    with pytest.raises(IncompleteDatasetError) as raised:  # opened by its .partial name: running too, not to be resumed
        open_dataset(partial_path(dst))
    assert str(raised.value) == (f"{partial_path(dst)}: a conversion in progress: packer (pid {first.pid}) is writing it now; "
                                 "wait for it to finish and open out.lmdb")
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert len(open_dataset(dst)) == 18 and not lock.exists()


def test_a_second_command_names_the_first_after_its_checkpoint(image_folder, tmp_path):
    """Once the running conversion has saved a checkpoint, a second plain command must still name
    it as running, not call its partial output an interrupted conversion to resume (which, with
    --resume, would be refused only by the lock anyway)."""
    dst = tmp_path / "out.lmdb"
    args = ["convert", str(image_folder), str(dst), "-j", "1", "-q", "--size", "16"]
    child = "import packer.writers.journal as j; j.CHECKPOINT_SECONDS = 0.0; j.UNTIMED_CHECKPOINT_INPUTS = 1; " + SLOW_CHILD  # a checkpoint after every input
    first = subprocess.Popen([sys.executable, "-c", child, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while saved_inputs(partial_path(dst)) is None:
        assert first.poll() is None, first.communicate()
        assert time.time() < deadline
        time.sleep(0.01)
    second = CliRunner().invoke(cli, args)
    assert second.exit_code != 0
    assert f"another packer conversion (pid {first.pid}) is writing it now" in second.output, second.output
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert len(open_dataset(dst)) == 18


def test_a_probe_of_the_lock_is_not_taken_for_a_running_conversion(tmp_path):
    """lock_holder takes a shared lock for a moment; a conversion starting in that moment waits it
    out instead of naming the (stale) pid in the file as a running conversion."""
    import fcntl
    import threading

    path = tmp_path / "x.partial-lock"
    path.write_text("packer-lock 4242\n")  # a killed run's pid
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a probe, caught in its moment
    threading.Timer(0.03, lambda: os.close(fd)).start()
    lock = DestinationLock(path, "x").acquire()
    assert path.read_text() == f"packer-lock {os.getpid()}\n" and lock_holder(path) == str(os.getpid())
    lock.release()


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


def test_an_interruption_right_after_the_close_is_not_a_second_close(tmp_path, monkeypatch):
    """A Ctrl-C (SIGTERM, SIGHUP: raised as one) landing just after release() closed the lock's
    descriptor: the writer's __exit__ releases again, which must not close that number twice (it
    raised EBADF, which hid the interruption, and could close another file's descriptor)."""
    import packer.locking as locking

    path = tmp_path / "out.lmdb.partial-lock"
    lock = DestinationLock(path, "out.lmdb").acquire()
    closes, real_close = [], os.close

    def close_then_interrupt(fd):
        real_close(fd)
        closes.append(fd)
        if len(closes) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(locking.os, "close", close_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        lock.release()
    lock.release()  # what __exit__ does next
    assert len(closes) == 1 and not path.exists()


def test_an_interrupted_publication_stops_the_conversion(image_folder, tmp_path, monkeypatch):
    """End to end: the interruption lands in the lock's release at the end of finish; convert
    raises it (an Interrupted saying the output is complete), not an OSError a caller may catch."""
    import packer.locking as locking

    real_close, armed = os.close, []
    lock_fd = []
    real_acquire = DestinationLock.acquire

    def acquire(self):
        got = real_acquire(self)
        lock_fd.append(self._fd)
        return got

    def close(fd):
        real_close(fd)
        if lock_fd and fd == lock_fd[-1] and not armed:
            armed.append(fd)
            raise KeyboardInterrupt

    monkeypatch.setattr(DestinationLock, "acquire", acquire)
    monkeypatch.setattr(locking.os, "close", close)
    with pytest.raises(KeyboardInterrupt, match="output was complete"):
        convert(image_folder, tmp_path / "out.lmdb", image=ImageOptions(size=16), workers=1)
    assert armed and len(open_dataset(tmp_path / "out.lmdb")) > 0


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "blob", "webdataset"])
def test_a_ctrl_c_as_a_fresh_output_opens_leaves_nothing(tmp_path, monkeypatch, fmt):
    """The run said "nothing was written" and left DST.partial (an LMDB's 64 MB map), its journal
    and its lock (a fault sweep, 14 of 24 Ctrl-Cs just as DST.partial appeared)."""
    from packer.writers import get_writer

    writer_class = get_writer(fmt)
    real_open = writer_class._open

    def interrupted(self):
        real_open(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(writer_class, "_open", interrupted)
    with pytest.raises(KeyboardInterrupt):
        writer_class(tmp_path / "out", fingerprint={"format": fmt})
    assert list(tmp_path.iterdir()) == []


def test_a_symlink_where_the_lock_file_goes_is_refused_and_its_target_kept(image_folder, tmp_path):
    """The pid was written into whatever file the link pointed to."""
    mine = tmp_path / "mine.txt"
    mine.write_text("my notes")
    dst = tmp_path / "out.lmdb"
    lock_path(partial_path(dst)).symlink_to(mine)
    with pytest.raises(OutputError, match=r"out.lmdb: .*out.lmdb.partial-lock is a symbolic link, not packer's lock file; remove it$"):
        convert(image_folder, dst, image=ImageOptions(size=8), workers=1)
    assert mine.read_text() == "my notes" and not dst.exists()


def test_a_second_ctrl_c_during_the_cleanup_waits_for_it(tmp_path, monkeypatch):
    """Ctrl-C twice: the second landed in the cleanup of the first and cut it short, leaving the
    journal and lock file behind a run that said nothing was written (a fault sweep, 2 of 32)."""
    import signal

    import packer.writers.base as base

    real_remove = base.remove_path

    def remove_path(path):  # the second Ctrl-C, as the partial output goes
        os.kill(os.getpid(), signal.SIGINT)
        real_remove(path)

    writer = LMDBWriter(tmp_path / "out.lmdb", fingerprint={"format": "lmdb"})
    monkeypatch.setattr(base, "remove_path", remove_path)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with writer:
                raise KeyboardInterrupt  # the first, before any checkpoint
    finally:
        signal.signal(signal.SIGINT, previous)
    assert list(tmp_path.iterdir()) == []


def test_a_second_ctrl_c_still_stops_a_close_that_hangs(tmp_path, monkeypatch):
    """Only the removals wait for a second Ctrl-C: a close or an upload that hangs (a hung mount,
    S3) must stay interruptible, or only SIGKILL stops packer."""
    import signal
    import time

    writer = LMDBWriter(tmp_path / "out.lmdb", fingerprint={"format": "lmdb"})
    real_close = LMDBWriter._close

    def hangs(self):
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, while the close hangs
        time.sleep(30)
        real_close(self)

    monkeypatch.setattr(LMDBWriter, "_close", hangs)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            with writer:
                raise KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 10 and list(tmp_path.iterdir()) == []


def test_readers_import_where_there_is_no_flock():
    """The probe of a running conversion needs fcntl (POSIX); readers import without it."""
    code = "import sys; sys.modules['fcntl'] = None; from readers import open_dataset; from readers.formats.inprogress import lock_holder; print(lock_holder('x'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "None\n"), done.stderr


def test_a_stale_lock_of_a_longer_pid_is_replaced_whole(tmp_path):
    """The lock file of a killed run whose pid was longer: the pid written over it must not keep
    its tail ('packer-lock 9517\\n6789012'), which the next run refused as not packer's lock (a mutation sweep)."""
    from packer.locking import lock_text

    path = tmp_path / "x.lmdb.partial-lock"
    path.write_bytes(b"packer-lock 123456789012\n")
    lock = DestinationLock(path, "x").acquire()
    try:
        assert path.read_bytes() == lock_text(os.getpid()) and lock_holder(path) == str(os.getpid())
    finally:
        lock.release()

