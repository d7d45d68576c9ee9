"""Resume checkpoints of the blob, HDF5, LMDB and WebDataset shards are made durable beside the writing (a thread runs
their ``fsync`` and the journal's commit: packer/writers/checkpoints.py), and lose nothing by it:
a failed background ``fsync`` is the usual one-line error, an interrupted run keeps the last
whole commit, and a finished run's last inputs are checkpointed before its index is written."""

from __future__ import annotations

import errno
import os
import threading

import pytest
from click.testing import CliRunner

import packer.writers.journal as journal
from packer import ImageOptions, StorageOptions, convert
from packer.cli import cli
from packer.writers import checkpoints
from packer.writers.journal import journal_path
from roundtrip_checks import read_plain

SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob", "webdataset": ".shards"}
BACKGROUND = {"hdf5": True, "blob": True, "lmdb": True, "webdataset": True}


def _fsyncs_by_thread(monkeypatch) -> list[str]:
    seen: list[str] = []
    real = os.fsync

    def fsync(fd):
        seen.append(threading.current_thread().name)
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


@pytest.mark.parametrize("fmt", sorted(BACKGROUND))
def test_checkpoints_are_made_durable_in_a_thread_where_the_format_allows(fmt, image_folder, tmp_path, monkeypatch):
    """Every format makes its checkpoints durable in the checkpoint thread (the writing goes on
    meanwhile): os.fsync for the blob, HDF5 and the published WebDataset shards, lmdb's own
    Environment.sync for LMDB."""
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    seen = _fsyncs_by_thread(monkeypatch)
    if fmt == "lmdb":  # its data is synced by lmdb's Environment.sync (fdatasync), not os.fsync
        import packer.writers.lmdb as lmdb_writer

        real_call = lmdb_writer._lmdb_call

        def lmdb_call(fn, *args, **kwargs):
            if getattr(fn, "__name__", "") == "sync":
                seen.append(threading.current_thread().name)
            return real_call(fn, *args, **kwargs)

        monkeypatch.setattr(lmdb_writer, "_lmdb_call", lmdb_call)
    dst = tmp_path / f"out{SUFFIX[fmt]}"
    convert(image_folder, dst, format=fmt, image=ImageOptions(size=16), workers=1)
    assert ("packer-checkpoint" in seen) is BACKGROUND[fmt]
    meta, samples = read_plain(dst)  # read back with the format's own library
    assert meta["count"] == len(samples) == 18


@pytest.mark.parametrize("fmt", ["hdf5", "blob", "webdataset"])  # (LMDB's data sync is lmdb's own, tested below)
def test_a_failed_background_fsync_is_one_clear_line_and_leaves_nothing(fmt, image_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    real = os.fsync

    def fsync(fd):
        if threading.current_thread().name == "packer-checkpoint":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    dst = tmp_path / f"out{SUFFIX[fmt]}"
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(dst), "--format", fmt, "--size", "8", "-q", "-j", "1"])
    assert result.exit_code == 1, result.output
    assert "no space left on the device" in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == []  # no DST, no DST.partial, no journal


def test_an_interruption_waits_for_the_running_commit(image_folder, tmp_path, monkeypatch):
    """Ctrl-C while a commit is being made durable: the run stops only once that commit is whole,
    so what it says is saved is what the journal holds, and --resume finishes the same output."""
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    reference = convert(image_folder, tmp_path / "ref.blob", image=ImageOptions(size=16), workers=1)
    started, release = threading.Event(), threading.Event()
    real_start = checkpoints.Committer.start

    def slow_start(self, commit):
        def slow():
            started.set()
            release.wait(5)
            commit()

        real_start(self, slow)

    calls = {"n": 0}
    from packer.writers.blob import BlobWriter

    real_add = BlobWriter.add

    def add(self, sample):
        calls["n"] += 1
        if calls["n"] == 10:  # a commit is running now: interrupt, and let it finish only afterwards
            assert started.wait(5)
            threading.Timer(0.3, release.set).start()
            raise KeyboardInterrupt
        return real_add(self, sample)

    monkeypatch.setattr(checkpoints.Committer, "start", slow_start)
    monkeypatch.setattr(BlobWriter, "add", add)
    dst = tmp_path / "out.blob"
    with pytest.raises(KeyboardInterrupt, match=r"(\d+) of 18 inputs are saved") as caught:
        convert(image_folder, dst, image=ImageOptions(size=16), workers=1)
    saved = int(str(caught.value).split(" of ")[0].rsplit(" ", 1)[-1])
    assert saved >= 1 and journal.saved_inputs(dst.with_name("out.blob.partial")) == saved
    monkeypatch.setattr(BlobWriter, "add", real_add)
    monkeypatch.setattr(checkpoints.Committer, "start", real_start)
    report = convert(image_folder, dst, image=ImageOptions(size=16), workers=1, resume=True)
    assert report.resumed == saved
    assert read_plain(dst)[1] == read_plain(reference.dst)[1]
    assert not journal_path(dst.with_name("out.blob.partial")).exists()


def test_lmdb_never_resizes_its_map_under_a_running_sync(image_folder, tmp_path, monkeypatch):
    """The map grows while samples are written; a sync of the old map still running in the
    checkpoint thread would touch unmapped memory: the growth waits for it."""
    import packer.writers.lmdb as lmdb_writer

    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)

    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    monkeypatch.setattr(lmdb_writer, "INITIAL_MAP_SIZE", 1 << 16)  # grows many times
    monkeypatch.setattr(lmdb_writer, "TRANSACTION_BYTES", 1 << 12)
    syncing = threading.Event()
    overlaps: list[int] = []
    real_call = lmdb_writer._lmdb_call

    def lmdb_call(fn, *args, **kwargs):  # lmdb's types cannot be patched: the writer's one door to them is
        name = getattr(fn, "__name__", "")
        if name == "sync":
            syncing.set()
            try:
                threading.Event().wait(0.002)  # a slow disk
                return real_call(fn, *args, **kwargs)
            finally:
                syncing.clear()
        if name == "set_mapsize" and syncing.is_set():
            overlaps.append(args[0])
        return real_call(fn, *args, **kwargs)

    monkeypatch.setattr(lmdb_writer, "_lmdb_call", lmdb_call)
    report = convert(image_folder, tmp_path / "out.lmdb", image=ImageOptions(size=32), workers=1)
    assert overlaps == []
    assert read_plain(report.dst)[1] and report.written == 18


@pytest.mark.parametrize("fmt", sorted(SUFFIX))
def test_every_format_checkpoints_at_the_background_spacing(fmt, image_folder, tmp_path, monkeypatch):
    """A checkpoint synced in the background costs the writing nothing and leaves the last sync
    less to write, so every format (all four sync in the background without a sink) takes one
    every BACKGROUND_CHECKPOINT_BYTES, not CHECKPOINT_BYTES."""
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 1e9)
    monkeypatch.setattr(journal, "BACKGROUND_CHECKPOINT_BYTES", 1)
    monkeypatch.setattr(journal, "CHECKPOINT_BYTES", 1 << 40)
    commits = []
    real = journal.Journal.commit
    monkeypatch.setattr(journal.Journal, "commit", lambda self, *a, **k: (commits.append(1), real(self, *a, **k))[1])
    storage = StorageOptions(shard_size=4) if fmt == "webdataset" else None  # checkpoints fall on shard ends
    convert(image_folder, tmp_path / f"out{SUFFIX[fmt]}", format=fmt, image=ImageOptions(size=8), storage=storage, workers=1)
    assert len(commits) >= 1, len(commits)  # (one in flight at a time)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names the synced files through /proc (Linux)")
def test_every_shard_a_checkpoint_lists_was_synced_before_it_is_committed(image_folder, tmp_path, monkeypatch):
    """WebDataset's checkpoints list the shards published so far; each was fsynced before the
    journal commits a checkpoint that lists it (in the checkpoint thread, or in the driver for
    the last one, taken while finishing)."""
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    synced: list[tuple[str, str]] = []  # (thread, file name)
    real_fsync = os.fsync

    def fsync(fd):
        synced.append((threading.current_thread().name, os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    missing: list[list[str]] = []
    listed: set[str] = set()
    real_commit = journal.Journal.commit

    def commit(self, checkpoint, *args, **kwargs):
        listed.update(checkpoint.state["shards"])
        missing.append([shard for shard in checkpoint.state["shards"] if shard not in {name for _, name in synced}])
        return real_commit(self, checkpoint, *args, **kwargs)

    monkeypatch.setattr(journal.Journal, "commit", commit)
    dst = tmp_path / "out.shards"
    convert(image_folder, dst, format="webdataset", image=ImageOptions(size=8), storage=StorageOptions(shard_size=3), workers=1)
    assert len(listed) == 6 and missing == [[]] * len(missing), missing
    assert any(thread == "packer-checkpoint" and name.startswith("shard-") for thread, name in synced)
    assert len(read_plain(dst)[1]) == 18
