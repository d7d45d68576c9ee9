"""``--resume``: a conversion killed with SIGKILL carries on from its last checkpoint, and the
result is sample-for-sample identical to an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from checkpoints import convert_until_checkpoint
from imagefiles import jpeg_bytes, write
from packer import ImageOptions, StorageOptions, convert
from packer.errors import OptionError, OutputExistsError
from packer.samples import natural_image
from packer.verify import verify
from packer.writers.journal import journal_path
from readers.formats import open_store

FORMATS = ("lmdb", "hdf5", "blob", "webdataset")
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob", "webdataset": ".shards", "webdataset-fragments": ".shards"}
SHARD_SIZE = 20
#: The child commits a checkpoint this often (seconds), so a kill lands between checkpoints.
CHILD = "import sys, packer.writers.journal as j; j.CHECKPOINT_SECONDS = 0.02; j.UNTIMED_CHECKPOINT_INPUTS = 1; from packer.cli import cli; cli(sys.argv[1:])"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """240 full-size JPEGs in 2 classes (a second or so of work), 2 of them broken."""
    root = tmp_path_factory.mktemp("resume-src")
    data = jpeg_bytes(natural_image(np.random.default_rng(0), 375, 500), quality=90)
    for i in range(240):
        write(root / f"c{i % 2}" / f"{i:04d}.jpg", data if i not in (33, 150) else b"not a jpeg")
    return root


def _options(fmt: str) -> tuple[list[str], dict]:
    """CLI arguments and API keywords (no workers: :func:`_start` gives them); ``webdataset-fragments``:
    3 pieces for 2 workers, so each is converted in fragments (checkpoints still only between pieces)."""
    fragments = fmt == "webdataset-fragments"
    fmt = "webdataset" if fragments else fmt
    args = ["--size", "24", "--format", fmt]
    kwargs = {"format": fmt, "image": ImageOptions(size=24)}
    if fmt == "webdataset":
        shard_size = 80 if fragments else SHARD_SIZE
        args += ["--shard-size", str(shard_size)]
        kwargs["storage"] = StorageOptions(shard_size=shard_size)
    return args, kwargs


def _start(source: Path, dst: Path, *args: str, workers: int = 1) -> subprocess.Popen:
    """``packer convert`` in a child process group of its own (it and its workers)."""
    command = [sys.executable, "-c", CHILD, "convert", str(source), str(dst), "-j", str(workers), "-q", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the conversion and its workers at once (as the OOM killer or a lost node would)."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _samples(path: Path) -> list[tuple[int, tuple, bytes]]:
    store = open_store(path)
    return [(label, tuple(shape), bytes(payload)) for label, shape, payload in store._records(range(len(store)))]


def _meta(path: Path) -> dict:
    data = open_store(path).meta.to_dict()
    data.pop("created")
    return data


@pytest.mark.parametrize("fmt", [*FORMATS, "webdataset-fragments"])
def test_sigkill_then_resume_gives_the_uninterrupted_result(tmp_path, source, fmt):
    args, kwargs = _options(fmt)
    dst = tmp_path / f"out{SUFFIX[fmt]}"
    partial = dst.with_name(dst.name + ".partial")
    journal = journal_path(partial) / "journal.json"
    proc = _start(source, dst, *args, workers=2 if fmt == "webdataset-fragments" else 1)
    deadline = time.time() + 60
    while not journal.exists():  # a first checkpoint is committed
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.005)
    time.sleep(random.Random(fmt).uniform(0.0, 0.25 if fmt != "webdataset-fragments" else 0.02))  # then a random point
    assert proc.poll() is None, "the conversion finished before it could be killed"
    _kill(proc)
    assert not dst.exists() and partial.exists()
    committed = json.loads(journal.read_text())["inputs"]
    assert 0 < committed < 240  # resumed from the middle, not started over
    report = convert(source, dst, workers=2, resume=True, **kwargs)
    assert not partial.exists() and not journal.parent.exists()
    reference = convert(source, tmp_path / f"ref{SUFFIX[fmt]}", workers=2, **kwargs)
    assert report.written == reference.written == 238 and len(report.skipped) == 2
    assert _samples(dst) == _samples(reference.dst)
    assert _meta(dst) == _meta(reference.dst)
    assert verify(dst).ok


def test_resume_refuses_different_options_and_keeps_the_partial(tmp_path, source):
    dst = tmp_path / "out.blob"
    partial = dst.with_name("out.blob.partial")
    proc = _start(source, dst, "--size", "24")
    journal = journal_path(partial) / "journal.json"
    deadline = time.time() + 60
    while not journal.exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.005)
    _kill(proc)
    with pytest.raises(OptionError, match=r"--size was 24x24 in the interrupted run, now 32x32; .* or with --overwrite instead of --resume"):
        convert(source, dst, image=ImageOptions(size=32), workers=1, resume=True)
    assert partial.exists() and journal.exists()
    report = convert(source, dst, image=ImageOptions(size=24), workers=2, resume=True)
    assert report.written == 238


def test_resume_without_an_interrupted_run_starts_over(tmp_path, image_folder):
    dst = tmp_path / "fresh.lmdb"
    report = convert(image_folder, dst, image=ImageOptions(size=8), workers=1, resume=True)
    assert report.written == 18 and not journal_path(dst.with_name("fresh.lmdb.partial")).exists()


def test_resume_of_a_finished_conversion_says_it_is_complete(tmp_path, image_folder):
    """A retry with --resume of a run that finished just before it was stopped (its Ctrl-C said
    'interrupted after the output was complete'): one line saying so, the output untouched."""
    dst = tmp_path / "done.lmdb"
    convert(image_folder, dst, image=ImageOptions(size=8), workers=1)
    before = {p.name: p.read_bytes() for p in dst.iterdir()}
    with pytest.raises(OutputExistsError, match="done.lmdb: already complete, nothing to resume; pass --overwrite instead of --resume"):
        convert(image_folder, dst, image=ImageOptions(size=8), workers=1, resume=True)
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before


def test_an_interrupted_overwrite_of_a_finished_dst_is_resumed_with_both_flags(tmp_path, image_folder, monkeypatch):
    """A finished DST, then an --overwrite run over it interrupted after a checkpoint: --resume
    alone must not say 'already complete, nothing to resume' (and advise --overwrite, which
    discards the checkpoint), nor a plain run 'already exists'; both name --resume --overwrite."""
    from packer.writers import journal
    from packer.writers.lmdb import LMDBWriter

    dst = tmp_path / "r.lmdb"
    convert(image_folder, dst, image=ImageOptions(size=8), workers=1)
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)  # a checkpoint after every input
    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    real_add, calls = LMDBWriter.add, {"n": 0}

    def add(self, sample):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return real_add(self, sample)

    monkeypatch.setattr(LMDBWriter, "add", add)
    with pytest.raises(KeyboardInterrupt, match="inputs are saved"):
        convert(image_folder, dst, image=ImageOptions(size=12), workers=1, overwrite=True)
    monkeypatch.setattr(LMDBWriter, "add", real_add)
    for resume in (True, False):
        with pytest.raises(OutputExistsError, match=r"r.lmdb: an interrupted conversion replacing it saved \d+ inputs?; run with --resume --overwrite"):
            convert(image_folder, dst, image=ImageOptions(size=12), workers=1, resume=resume)
    report = convert(image_folder, dst, image=ImageOptions(size=12), workers=1, resume=True, overwrite=True)
    assert report.resumed > 0 and report.shape == (3, 12, 12)


def test_the_journal_rows_stay_raw_little_endian_int64(tmp_path):
    """samples.i64 holds 8 little-endian int64 per sample (shard, offset, nbytes, label, C, H, W,
    crc32), as before the rows got names; a checkpoint reads them back by name."""
    from packer.writers.journal import ROW_COLUMNS, ROW_DTYPE, Checkpoint, Journal

    assert ROW_COLUMNS == ("shard", "offset", "nbytes", "label", "channels", "height", "width", "crc32")
    values = [[1, 640, 768, 2, 3, 16, 16, 0xDEADBEEF], [1, 2048, 256, -1, 1, 16, 16, 7]]
    journal = Journal(tmp_path / "out.partial", {"format": "test"})
    journal.start()
    rows = np.array([tuple(v) for v in values], ROW_DTYPE)
    journal.commit(Checkpoint(2, 2, 1024, [], {}), rows)
    assert (journal.folder / "samples.i64").read_bytes() == np.array(values, "<i8").tobytes()
    loaded = journal.load()
    assert loaded is not None and loaded.rows["crc32"].tolist() == [0xDEADBEEF, 7] and loaded.rows["label"].tolist() == [2, -1]


def test_a_refused_resume_names_every_option_that_changed():
    """Sorted by name, the first difference alone could be one the user never set (a default
    that followed the one they changed)."""
    from packer.writers.fingerprint import fingerprint_difference

    old = {"--size": [224, 224], "--resize-mode": "center-crop", "--grayscale": False, "--quality": None}
    new = {"--size": [128, 128], "--resize-mode": "shorter", "--grayscale": True, "--quality": None}
    assert fingerprint_difference(old, new) == ("--grayscale was off in the interrupted run, now on; --resize-mode was center-crop in "
                                                "the interrupted run, now shorter; --size was 224x224 in the interrupted run, now 128x128")
    assert fingerprint_difference(old, dict(old)) is None
    # --eos none is "none", no separator (it read "now not set": the default, the opposite; a text walkthrough)
    assert fingerprint_difference({"--eos": 0}, {"--eos": None}) == "--eos was 0 in the interrupted run, now none"
    tokenizer = {"kind": "huggingface", "vocab_size": 300, "eos_id": 1, "sha256": "ab12", "name": "tok2.json"}
    other = {"kind": "bytes", "vocab_size": 257, "eos_id": 256, "sha256": "", "name": "bytes"}
    # another file: one phrase naming both (every field of the record was listed, a sha256 "now" empty)
    assert fingerprint_difference({"--tokenizer": tokenizer}, {"--tokenizer": other}) == (
        "--tokenizer was tok2.json in the interrupted run, now bytes (another file)")
    # the same bytes under another name are the same tokenizer (a copy was refused for its name)
    assert fingerprint_difference({"--tokenizer": tokenizer}, {"--tokenizer": {**tokenizer, "name": "tok.json"}}) is None


def test_a_run_that_failed_at_a_bad_input_resumes_skipping(tmp_path, image_folder):
    """The failure said 'pass --on-error skip', and --resume then refused the changed option, so
    only --overwrite went on, discarding the checkpoint (a data-safety walkthrough). A fail-mode
    checkpoint skipped nothing, so skip mode would have saved the same: it resumes, and the
    result is what one skip-mode run makes; the other way round stays refused."""
    from packer.writers.fingerprint import fingerprint_difference

    assert fingerprint_difference({"--on-error": "fail"}, {"--on-error": "skip"}) is None
    assert fingerprint_difference({"--on-error": "skip"}, {"--on-error": "fail"}) == (
        "--on-error was skip in the interrupted run, now fail")
    import shutil

    from click.testing import CliRunner

    from packer.cli import cli

    src = tmp_path / "src"
    shutil.copytree(image_folder, src)
    (src / "class_02" / "zzz.jpg").write_bytes(b"not a jpeg")  # the last input
    dst = tmp_path / "d.lmdb"
    args = ["convert", str(src), str(dst), "--size", "8", "-j", "1", "-q", "--on-error", "fail"]
    slow = "import time, packer.writers.base as b; add = b.Writer.add; b.Writer.add = lambda s, x: (time.sleep(0.05), add(s, x))[1]"
    assert convert_until_checkpoint(args, journal_path(tmp_path / "d.lmdb.partial") / "journal.json", setup=slow) < 19
    failed = CliRunner().invoke(cli, [*args, "--resume"])  # it meets the bad input, and keeps its checkpoint
    assert failed.exit_code == 1 and "zzz.jpg" in failed.output and "--on-error skip" in failed.output, failed.output
    done = CliRunner().invoke(cli, [*args[:-1], "skip", "--resume"])
    assert done.exit_code == 0, done.output
    convert(src, tmp_path / "f.lmdb", image=ImageOptions(size=8), workers=1, on_error="skip")
    a, b = open_store(dst), open_store(tmp_path / "f.lmdb")
    assert len(a) == len(b) == 18 and [s.path for s in a.meta.skipped] == [s.path for s in b.meta.skipped] == ["class_02/zzz.jpg"]
    assert [a.read(i)[1] for i in range(18)] == [b.read(i)[1] for i in range(18)]
    assert all((a.read(i)[0] == b.read(i)[0]).all() for i in range(18)) and a.stored_checksums().tolist() == b.stored_checksums().tolist()


def test_flags_take_booleans_only():
    """``grayscale="no"`` is truthy: it converted to grayscale and recorded "no"."""
    from packer import TextOptions

    with pytest.raises(OptionError, match="--grayscale: must be True or False, got 'no'"):
        ImageOptions(grayscale="no")
    with pytest.raises(OptionError, match="--lines: must be True or False, got 1"):
        TextOptions(lines=1)


@pytest.mark.parametrize("fmt", ["blob", "webdataset"])
def test_resume_with_src_and_dst_spelled_another_way(tmp_path, source, fmt, monkeypatch):
    """Killed when run as ``packer convert src out`` from the folder above, resumed with absolute
    paths: the same conversion. Both were refused before, the source as "changed since the
    interrupted run" and the DST as "dst was ..., now ..." (a Streaming user's walkthrough)."""
    args, kwargs = _options(fmt)
    monkeypatch.chdir(tmp_path)
    os.symlink(source, tmp_path / "src")
    dst = tmp_path / f"out{SUFFIX[fmt]}"
    journal = journal_path(dst.with_name(dst.name + ".partial")) / "journal.json"
    committed = convert_until_checkpoint(["convert", "src", dst.name, "-j", "2", *args], journal)
    assert 0 < committed < 240
    report = convert(tmp_path / "src", dst, workers=2, resume=True, **kwargs)
    assert report.resumed == committed
    assert _samples(dst) == _samples(convert(source, tmp_path / f"ref{SUFFIX[fmt]}", workers=2, **kwargs).dst)


def test_a_journal_from_before_absolute_paths_still_resumes(tmp_path, source, monkeypatch):
    """Journals written before the listing and DST were made absolute recorded them as given
    (``src/c0/0000.jpg``, ``out.blob``): such an interrupted run still resumes (a review of the
    change: it was refused as a changed source)."""
    args, kwargs = _options("blob")
    monkeypatch.chdir(tmp_path)
    os.symlink(source, tmp_path / "src")
    journal = journal_path(tmp_path / "out.blob.partial") / "journal.json"
    convert_until_checkpoint(["convert", "src", "out.blob", "-j", "2", *args], journal)
    data = json.loads(journal.read_text())
    fingerprint = data["fingerprint"]
    fingerprint["listing"] = fingerprint.pop("listing as given")  # as the older code wrote it
    fingerprint["dst"] = fingerprint.pop("dst as given")
    assert fingerprint["dst"] == "out.blob"
    journal.write_text(json.dumps(data))
    report = convert(Path("src"), Path("out.blob"), workers=2, resume=True, **kwargs)
    assert report.resumed == data["inputs"] > 0
    assert _samples(tmp_path / "out.blob") == _samples(convert(source, tmp_path / "ref.blob", workers=2, **kwargs).dst)


def test_a_refused_resume_names_the_folders_that_changed(tmp_path, image_folder):
    """'the source folder changed' named nothing to put back (a data-safety walkthrough): each
    folder's inputs are fingerprinted too, and the refusal names those that differ."""
    import shutil

    from click.testing import CliRunner

    from packer.cli import cli

    src = tmp_path / "src"
    shutil.copytree(image_folder, src)
    dst = tmp_path / "d.lmdb"
    args = ["convert", str(src), str(dst), "--size", "8", "-j", "1", "-q"]
    slow = "import time, packer.writers.base as b; add = b.Writer.add; b.Writer.add = lambda s, x: (time.sleep(0.05), add(s, x))[1]"
    convert_until_checkpoint(args, journal_path(tmp_path / "d.lmdb.partial") / "journal.json", setup=slow)
    shutil.copy(src / "class_01" / sorted(os.listdir(src / "class_01"))[0], src / "class_01" / "zz_copy.jpg")
    (src / "class_02" / sorted(os.listdir(src / "class_02"))[0]).unlink()
    refused = CliRunner().invoke(cli, [*args, "--resume"])
    assert refused.exit_code != 0 and ("the source folder changed since the interrupted run (files added, removed or modified): "
                                       "class_01 has 1 input more, class_02 has 1 input fewer; put the source back") in refused.output


def test_the_folders_named_in_a_refusal_cover_every_kind_of_change():
    from packer.writers.fingerprint import FOLDERS_KEY, fingerprint_difference

    old = {"listing": "a", FOLDERS_KEY: {"/d/c1": [10, "x"], "/d/c2": [3, "z"]}, "source": "/d"}
    new = {"listing": "b", FOLDERS_KEY: {"/d/c1": [10, "y"], "/d/c3": [2, "q"]}, "source": "/d"}
    assert fingerprint_difference(old, new).endswith(": c1 has files modified, c2 is gone (3 inputs), c3 is new (2 inputs)")
    # a Python dataset's items have no folder (they crashed the naming: os.path.relpath(""))
    flat = {"listing": "a", FOLDERS_KEY: {"": [10, "x"]}, "source": "python:m.C"}
    assert fingerprint_difference(flat, {**flat, "listing": "b", FOLDERS_KEY: {"": [11, "y"]}}).endswith(": its top folder has 1 input more")
    # a journal of an older packer has no folders: the change is said as before
    assert fingerprint_difference({"listing": "a", "source": "/d"}, new).endswith("(files added, removed or modified)")


def test_a_file_rewritten_at_the_same_size_changes_the_listing(tmp_path):
    """A BMP of the same dimensions rewritten keeps its size: the listing stamps the modification
    time too, so --resume refuses a source changed so (a mutation sweep: no test rewrote a file in place)."""
    cv2 = pytest.importorskip("cv2")
    from packer.writers.fingerprint import listing_digest

    path = tmp_path / "a.bmp"  # a BMP of the same dimensions always has the same size
    cv2.imwrite(str(path), np.zeros((8, 8, 3), np.uint8))
    before = listing_digest([(str(path), 0)])
    size = path.stat().st_size
    cv2.imwrite(str(path), np.full((8, 8, 3), 255, np.uint8))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert path.stat().st_size == size
    assert listing_digest([(str(path), 0)]) != before
