"""``--resume`` of a source whose files were only touched since the interrupted run (a copy, a
checkout or a restore gave them new modification times): the inputs it converted from the
changed folders are converted again and compared with its journal's checksums
(packer/touched.py). It was refused as "the source folder changed", the progress lost."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import cv2
import lmdb
import numpy as np
import pytest
from click.testing import CliRunner

import packer.parallel as parallel
from checkpoints import convert_until_checkpoint, inputs_converted
from packer import ImageOptions, StorageOptions, convert
from packer.cli import cli
from packer.writers.journal import journal_path
from readers.formats import open_store

SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob", "webdataset": ".shards"}
PER_CLASS = 30
#: Each written sample takes 20 ms in the child: the kill lands with a part converted.
SLOW = ("import time, packer.writers.base as b, packer.writers.webdataset.writer as w; add = b.Writer.add; "
        "b.Writer.add = lambda s, x: (time.sleep(0.02), add(s, x))[1]; piece = w.ShardWriter.add_piece; "
        "w.ShardWriter.add_piece = lambda s, r: (time.sleep(0.1), piece(s, r))[1]")


def _bmp(seed: int) -> bytes:
    """A 16x16 BMP: every one has the same size in bytes, whatever its pixels."""
    pixels = np.random.default_rng(seed).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    return cv2.imencode(".bmp", pixels)[1].tobytes()


@pytest.fixture
def src(tmp_path) -> Path:
    root = tmp_path / "src"
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(PER_CLASS):
            (root / f"c{c}" / f"{i:03d}.bmp").write_bytes(_bmp(100 * c + i))
    return root


def _args(fmt: str, src: Path, dst: Path) -> list[str]:
    extra = ["--shard-size", "4"] if fmt == "webdataset" else []
    return ["convert", str(src), str(dst), "--size", "8", "-j", "1", "-q", "--format", fmt, *extra]


def _kwargs(fmt: str) -> dict:
    return dict(format=fmt, image=ImageOptions(size=8), workers=1,
                **({"storage": StorageOptions(shard_size=4)} if fmt == "webdataset" else {}))


def _interrupted(fmt: str, src: Path, dst: Path) -> int:
    journal = journal_path(dst.with_name(dst.name + ".partial")) / "journal.json"
    saved = convert_until_checkpoint(_args(fmt, src, dst), journal, setup=SLOW, until=lambda: _saved(journal) >= 8)
    assert 8 <= saved < 2 * PER_CLASS
    return saved


def _saved(journal: Path) -> int:
    try:
        return json.loads(journal.read_text())["inputs"]
    except (OSError, ValueError):  # (replaced as it was read)
        return 0


def _touch_all(src: Path) -> None:
    later = time.time() + 5
    for path in src.rglob("*.bmp"):
        os.utime(path, (later, later))


def _lmdb_items(path: Path) -> dict[bytes, bytes]:
    """Every key and value but the metadata record (its creation time), by the lmdb library."""
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True)
    with env.begin() as txn:
        items = {bytes(k): bytes(v) for k, v in txn.cursor() if k != b"__meta__"}
    env.close()
    return items


def _samples(path: Path) -> list[tuple[int, tuple, bytes]]:
    store = open_store(path)
    return [(int(label), tuple(shape), bytes(payload)) for label, shape, payload in store._records(range(len(store)))]


@pytest.mark.parametrize("fmt", list(SUFFIX))
def test_a_source_touched_whole_resumes_converting_only_what_was_left(fmt, src, tmp_path, monkeypatch, caplog):
    dst = tmp_path / f"out{SUFFIX[fmt]}"
    saved = _interrupted(fmt, src, dst)
    _touch_all(src)
    with inputs_converted(monkeypatch, parallel) as sizes:
        report = convert(src, dst, resume=True, **_kwargs(fmt))
    assert report.resumed == saved
    assert sizes[0] == saved  # the converted inputs, compared; then the rest (a WebDataset's in pieces)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("--resume:")]
    assert len(said) == 2 and f"the {saved:,} inputs convert as before: resuming" in said[1]
    expected = convert(src, tmp_path / f"ref{SUFFIX[fmt]}", **_kwargs(fmt)).dst
    assert _samples(dst) == _samples(expected)
    if fmt == "lmdb":
        assert _lmdb_items(dst) == _lmdb_items(expected)


def test_a_converted_input_rewritten_at_the_same_size_is_named_and_the_run_stays_resumable(src, tmp_path):
    dst = tmp_path / "out.lmdb"
    _interrupted("lmdb", src, dst)
    original = (src / "c0" / "000.bmp").read_bytes()
    (src / "c0" / "000.bmp").write_bytes(_bmp(999))  # converted first: its sample is in the output
    journal = (journal_path(tmp_path / "out.lmdb.partial") / "journal.json").read_bytes()
    refused = CliRunner().invoke(cli, [*_args("lmdb", src, dst), "--resume"])
    assert refused.exit_code == 2 and (
        "--resume: the source folder changed since the interrupted run: c0/000.bmp converts differently now; put it back as it was"
    ) in refused.output
    assert (journal_path(tmp_path / "out.lmdb.partial") / "journal.json").read_bytes() == journal  # nothing written
    (src / "c0" / "000.bmp").write_bytes(original)  # put back (a new modification time again)
    assert CliRunner().invoke(cli, [*_args("lmdb", src, dst), "--resume"]).exit_code == 0
    assert _lmdb_items(dst) == _lmdb_items(convert(src, tmp_path / "ref.lmdb", **_kwargs("lmdb")).dst)


def test_an_input_not_yet_converted_is_converted_as_it_is_now(src, tmp_path, monkeypatch):
    """Only the inputs the journal holds must agree: the rest are converted from the source as
    it is, so a file the interrupted run had not reached may change in any way at its size."""
    dst = tmp_path / "out.lmdb"
    saved = _interrupted("lmdb", src, dst)
    last = src / "c1" / f"{PER_CLASS - 1:03d}.bmp"
    last.write_bytes(_bmp(4242))
    with inputs_converted(monkeypatch, parallel) as sizes:
        assert convert(src, dst, resume=True, **_kwargs("lmdb")).resumed == saved
    assert sum(sizes) <= 2 * PER_CLASS  # c0's converted inputs at most (c1 is its own folder), then the rest
    assert _lmdb_items(dst) == _lmdb_items(convert(src, tmp_path / "ref.lmdb", **_kwargs("lmdb")).dst)


def test_another_size_or_another_file_is_refused_as_before(src, tmp_path):
    dst = tmp_path / "out.lmdb"
    _interrupted("lmdb", src, dst)
    shutil.copy(src / "c1" / "001.bmp", src / "c1" / "zz_new.bmp")
    refused = CliRunner().invoke(cli, [*_args("lmdb", src, dst), "--resume"])
    assert refused.exit_code != 0 and "c1 has 1 input more" in refused.output and "convert differently" not in refused.output


def test_an_input_it_skipped_that_converts_now_is_named(src, tmp_path):
    """A skipped input has no checksum to compare: it must fail again, or the output would lack
    a sample the source now gives."""
    broken = src / "c0" / "000.bmp"
    good = broken.read_bytes()
    broken.write_bytes(b"x" * len(good))  # the same size, not an image
    dst = tmp_path / "out.lmdb"
    _interrupted("lmdb", src, dst)
    broken.write_bytes(good)
    converted = (src / "c0" / "001.bmp").read_bytes()
    (src / "c0" / "001.bmp").write_bytes(b"x" * len(converted))  # and one it converted fails now
    refused = CliRunner().invoke(cli, [*_args("lmdb", src, dst), "--resume"])
    assert refused.exit_code == 2 and "c0/000.bmp, c0/001.bmp convert differently now; put them back as they were" in refused.output
    broken.write_bytes(b"x" * len(good))  # as they were: the one still skipped
    (src / "c0" / "001.bmp").write_bytes(converted)
    resumed = CliRunner().invoke(cli, [*_args("lmdb", src, dst), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert _lmdb_items(dst) == _lmdb_items(convert(src, tmp_path / "ref.lmdb", **_kwargs("lmdb")).dst)


def test_an_option_changed_as_well_is_refused_naming_it_and_nothing_is_adopted(src, tmp_path):
    """Touched files and another --shard-size (an option no sample's checksum holds): the option
    is named, as without the touch; comparing the inputs would find them the same and resume
    a dataset whose first shards hold 4 samples and the rest 5."""
    dst = tmp_path / "out.shards"
    _interrupted("webdataset", src, dst)
    _touch_all(src)
    journal = journal_path(tmp_path / "out.shards.partial") / "journal.json"
    before = journal.read_bytes()
    args = [*_args("webdataset", src, dst), "--resume"]
    refused = CliRunner().invoke(cli, [*args[: args.index("--shard-size")], "--shard-size", "5", *args[args.index("--shard-size") + 2 :]])
    assert refused.exit_code != 0 and "--shard-size was 4 in the interrupted run, now 5" in refused.output, refused.output
    assert journal.read_bytes() == before


def test_a_conversion_that_took_the_lock_meanwhile_is_left_alone(src, tmp_path, monkeypatch):
    """Another packer took the partial output's lock after this run's early probe (two resumes
    started at once): the check neither loads (its load cuts the rows and names files back to
    the checkpoint, which the other run is appending to) nor adopts; the one line names the
    lock's holder, as the writer's does."""
    import packer.engine as engine
    from packer.errors import OutputError
    from packer.locking import DestinationLock, lock_path

    dst = tmp_path / "out.lmdb"
    _interrupted("lmdb", src, dst)
    _touch_all(src)
    journal = journal_path(tmp_path / "out.lmdb.partial") / "journal.json"
    before = journal.read_bytes()
    monkeypatch.setattr(engine, "lock_holder", lambda path: None)  # (the probe ran before the other took it)
    lock = DestinationLock(lock_path(tmp_path / "out.lmdb.partial"), str(dst)).acquire()
    try:
        with pytest.raises(OutputError, match=rf"\(pid {os.getpid()}\) is writing it now"):
            convert(src, dst, resume=True, **_kwargs("lmdb"))
    finally:
        lock.release()
    assert journal.read_bytes() == before


def test_only_the_inputs_of_the_touched_folders_are_converted_again(src, tmp_path, monkeypatch):
    dst = tmp_path / "out.lmdb"
    saved = _interrupted("lmdb", src, dst)
    later = time.time() + 5
    for path in (src / "c1").glob("*.bmp"):
        os.utime(path, (later, later))
    with inputs_converted(monkeypatch, parallel) as sizes:
        assert convert(src, dst, resume=True, **_kwargs("lmdb")).resumed == saved
    again = max(0, saved - PER_CLASS)  # c1's converted inputs (c0's come first, untouched)
    assert sum(sizes) == again + 2 * PER_CLASS - saved
    assert _lmdb_items(dst) == _lmdb_items(convert(src, tmp_path / "ref.lmdb", **_kwargs("lmdb")).dst)
