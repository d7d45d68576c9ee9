"""The one conversion driver (packer/engine.py): text gets everything images have (resume,
per-input timeout, crash isolation), interruptions keep their checkpoint, and options that do
not apply are refused."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lmdb
import numpy as np
import pytest
from click.testing import CliRunner

import packer.parallel
from checkpoints import CHILD, convert_until_checkpoint, inputs_converted
from faulty import FaultyTokenize
from packer import ImageOptions, StorageOptions, TextOptions, convert
from packer.cli import cli
from packer.engine import run
from packer.errors import InputError, OptionError, OutputExistsError
from packer.options import RunOptions
from packer.text import text_job
from packer.writers.journal import journal_path

LINES = 40_000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Four files of 10,000 one-line documents each (``--lines``): enough for a few checkpoints."""
    root = tmp_path_factory.mktemp("corpus")
    for f in range(4):
        (root / f"part{f}.txt").write_text("".join(f"document {f}-{i}: the quick brown fox {i * 7919 % 1000}\n" for i in range(LINES // 4)))
    return root


def stored_documents(path: Path) -> list[list[int]]:
    """Every document's token ids, read with the lmdb library alone (docs/FORMATS.md, "Text")."""
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True)
    with env.begin() as txn:
        meta = json.loads(txn.get(b"__meta__"))
        docs = [np.frombuffer(bytes(txn.get(b"%010d" % i))[16:], "<u2").tolist() for i in range(meta["count"])]
    env.close()
    return docs


def expected_documents(corpus: Path) -> list[list[int]]:
    return [[*line.encode(), 256] for f in sorted(corpus.iterdir()) for line in f.read_text().splitlines()]


def test_text_resume_after_sigkill_gives_the_uninterrupted_result(corpus, tmp_path, monkeypatch):
    dst = tmp_path / "t.lmdb"
    args = ["convert", str(corpus), str(dst), "--lines", "-j", "2", "-q"]
    saved = convert_until_checkpoint(args, journal_path(dst.with_name("t.lmdb.partial")) / "journal.json")
    assert 0 < saved < LINES
    refused = CliRunner().invoke(cli, args)  # a plain re-run does not silently start over
    assert refused.exit_code == 1 and f"saved {saved:,} input" in refused.stderr and "--resume" in refused.stderr
    with inputs_converted(monkeypatch, packer.parallel) as converted:
        report = convert(corpus, dst, text=TextOptions(lines=True), workers=2, resume=True)
    assert sum(converted) == LINES - saved and report.resumed == saved
    assert stored_documents(dst) == expected_documents(corpus)
    assert report.tokens == sum(map(len, expected_documents(corpus)))
    # The rate is this run's: the documents the interrupted run wrote are left out of it.
    assert report.resumed_written == saved and report.resumed_tokens == sum(map(len, expected_documents(corpus)[:saved]))
    assert report.tokens_per_second == pytest.approx((report.tokens - report.resumed_tokens) / report.seconds)


def test_a_text_journal_of_an_earlier_packer_is_refused_not_resumed(corpus, tmp_path):
    """Earlier packers counted a corpus's good documents only; now every non-blank line is an
    input (the workers skip the bad ones), so an old journal's count points at another line: a
    review resumed one and wrote documents twice. Such a journal (no "inputs" in its
    fingerprint) is refused, saying why, and the partial output is kept."""
    dst = tmp_path / "t.lmdb"
    args = ["convert", str(corpus), str(dst), "--lines", "-j", "2", "-q"]
    journal = journal_path(dst.with_name("t.lmdb.partial")) / "journal.json"
    convert_until_checkpoint(args, journal)
    data = json.loads(journal.read_text())
    del data["fingerprint"]["inputs"]  # as an earlier packer wrote it
    journal.write_text(json.dumps(data))
    refused = CliRunner().invoke(cli, [*args, "--resume"])
    assert refused.exit_code != 0 and "made by an earlier packer, which counted this source's inputs another way" in refused.stderr
    assert "another way; finish it with that packer, or with --overwrite instead of --resume" in refused.stderr
    assert journal.exists() and dst.with_name("t.lmdb.partial").exists()


@pytest.mark.parametrize("change", ["append", "touch"])
def test_a_resume_after_the_corpus_changed_says_to_put_it_back(tmp_path, change):
    """The refusal said "run with the same options to finish it", which cannot help when a
    source file changed (an LLM user's walkthrough): it says to put the source back. A file only
    touched is refused too (its modification time is what is recorded), and the refusal named
    no file, and said nothing of touching (a text walkthrough): it names the files modified since."""
    src = tmp_path / "c"
    src.mkdir()
    (src / "a.txt").write_text("".join(f"line {i}\n" for i in range(20000)), encoding="utf-8")
    (src / "b.txt").write_text("untouched\n", encoding="utf-8")
    dst = tmp_path / "t.lmdb"
    args = ["convert", str(src), str(dst), "--lines", "-j", "2", "-q"]
    convert_until_checkpoint(args, journal_path(dst.with_name("t.lmdb.partial")) / "journal.json")
    if change == "append":
        with open(src / "a.txt", "a", encoding="utf-8") as more:
            more.write("late\n")
    else:
        os.utime(src / "a.txt")
    refused = CliRunner().invoke(cli, [*args, "--resume"])
    assert refused.exit_code != 0 and ("the source folder changed since the interrupted run (files added, removed or modified): its top "
                                       "folder has files modified (a.txt modified since the interrupted run listed them); put the source "
                                       "back as it was to finish it (a file of a remote source or a text corpus touched, or rewritten with the "
                                       "same bytes, counts as modified: "
                                       "its modification time differs), or with --overwrite instead of --resume") in refused.stderr, refused.stderr


def test_text_inputs_that_crash_or_hang_a_worker_are_skipped(tmp_path):
    src = tmp_path / "c"
    src.mkdir()
    texts = ["fine one", "this one will CRASH the tokenizer", "fine two", "this one will HANG", "fine three"]
    for i, text in enumerate(texts):
        (src / f"d{i}.txt").write_text(text)
    job = text_job(src, TextOptions())
    job = dataclasses.replace(job, task=FaultyTokenize(job.task))
    report = run(job, "lmdb", tmp_path / "out.lmdb", storage=None, options=RunOptions(workers=2, timeout=3))
    reasons = {s.path: s.reason for s in report.skipped}
    assert "crashed" in reasons["d1.txt"] and "SIGSEGV" in reasons["d1.txt"]
    assert reasons["d3.txt"].startswith("timed out")
    assert stored_documents(tmp_path / "out.lmdb") == [[*t.encode(), 256] for t in texts if "CRASH" not in t and "HANG" not in t]


def test_a_single_input_gets_its_timeout_and_names_its_one_worker(tmp_path):
    """One input ran in packer's own process: --timeout was dropped (and a crashing decoder would
    take packer down), while the report said "with 2 workers"."""
    src = tmp_path / "c"
    src.mkdir()
    (src / "d0.txt").write_text("this one will HANG")
    (src / "empty.txt").write_text("")
    job = text_job(src, TextOptions())
    job = dataclasses.replace(job, task=FaultyTokenize(job.task))
    with pytest.raises(InputError, match=r"none of the 2 documents could be converted \(first: d0.txt: timed out after 2 s\)"):
        run(job, "lmdb", tmp_path / "out.lmdb", storage=None, options=RunOptions(workers=2, timeout=2))
    (src / "d0.txt").write_text("fine")
    report = convert(src, tmp_path / "ok.blob", workers=2, timeout=2, on_error="skip")
    assert report.written == 1 and report.workers == 1 and report.summary().startswith("wrote 1 document, 5 tokens")
    assert " with 1 worker;" in report.summary()


def interrupt_after_checkpoint(args: list[str], journal: Path, signum: int) -> tuple[int, str]:
    """Run ``packer *args`` (a checkpoint every 20 ms), send ``signum`` once a checkpoint exists;
    the exit code and stderr."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not journal.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.005)
    time.sleep(0.05)
    proc.send_signal(signum)
    _out, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_conversion_keeps_its_checkpoint_and_says_so(corpus, tmp_path, signum):
    dst = tmp_path / "t.lmdb"
    args = ["convert", str(corpus), str(dst), "--lines", "-j", "2", "-q"]
    code, err = interrupt_after_checkpoint(args, journal_path(dst.with_name("t.lmdb.partial")) / "journal.json", signum)
    if code == 0:  # finished before the signal landed: nothing to check
        pytest.skip("the conversion finished first")
    assert code == 130 and "Traceback" not in err, (code, err[-3000:])  # (once, under the whole suite: exit 1, its stderr unseen)
    line = err.strip().splitlines()[-1]
    assert line.startswith("Error: interrupted: ") and f"of {LINES:,} inputs are saved; run the same command with --resume to finish" in line
    saved = int(line.split("interrupted: ")[1].split(" of ")[0].replace(",", ""))
    assert saved > 0 and not dst.exists()
    result = CliRunner().invoke(cli, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    assert stored_documents(dst) == expected_documents(corpus)


def test_options_that_do_not_apply_are_refused(tmp_path, corpus, image_folder):
    cases = [
        (corpus, "x.lmdb", ["--size", "224"], "--size: applies to images only"),
        (corpus, "x.lmdb", ["--max-pixels", "10"], "--max-pixels: applies to images only"),
        (image_folder, "x.lmdb", ["--lines"], "text options (--lines) do not apply to an image folder"),
        (image_folder, "x.lmdb", ["--compression", "gzip"], "--compression: does not apply to lmdb output"),
        (image_folder, "x.h5", ["--shard-size", "5"], "--shard-size: does not apply to hdf5 output"),
        (image_folder, "x.lmdb", ["--quality", "80"], "--quality: applies to --encoding jpeg only"),
    ]
    for src, name, extra, message in cases:
        result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / name), *extra, "-q"])
        assert result.exit_code == 2 and message in result.stderr, (extra, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / name).exists()
    with pytest.raises(OptionError, match="--shard-bytes: does not apply to blob"):
        convert(image_folder, tmp_path / "x.blob", image=ImageOptions(size=8), storage=StorageOptions(shard_bytes=10))
    # the options that do apply to text are used: --timeout and --resume are the driver's
    report = convert(corpus, tmp_path / "ok.blob", text=TextOptions(lines=True), timeout=5, workers=1)
    assert report.written == LINES


def test_too_many_workers_are_capped_with_a_warning(image_folder, tmp_path, caplog):
    report = convert(image_folder, tmp_path / "w.lmdb", image=ImageOptions(size=8), workers=1000)
    assert report.workers == packer.parallel.default_workers()
    assert any("--workers 1000" in r.getMessage() and "usable cores" in r.getMessage() for r in caplog.records)


def test_a_plain_rerun_refuses_to_discard_a_checkpoint_unless_overwrite(corpus, tmp_path):
    dst = tmp_path / "t.blob"
    args = ["convert", str(corpus), str(dst), "--lines", "-j", "2", "-q"]
    saved = convert_until_checkpoint(args, journal_path(dst.with_name("t.blob.partial")) / "journal.json")
    with pytest.raises(OutputExistsError, match=f"saved {saved:,} inputs?;.*--resume.*--overwrite"):
        convert(corpus, dst, text=TextOptions(lines=True), workers=1)
    report = convert(corpus, dst, text=TextOptions(lines=True), workers=1, overwrite=True)
    assert report.written == LINES and report.resumed == 0


@pytest.mark.parametrize("fmt, name", [("hdf5", "o.h5"), ("lmdb", "o.lmdb"), ("blob", "o.blob"), ("webdataset", "o")])
def test_ctrl_c_inside_finish_then_resume_gives_the_uninterrupted_result(fmt, name, image_folder, tmp_path, monkeypatch):
    """Found by benchmarks.faults: an HDF5 file interrupted while its index was written could not
    be resumed, and the failed resume deleted the checkpoint."""
    import os
    import threading

    import packer.writers.journal as journal
    from packer.writers import get_writer
    from roundtrip_checks import read_plain

    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)

    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    reference = convert(image_folder, tmp_path / f"ref-{name}", format=fmt, image=ImageOptions(size=16), workers=1)
    writer_class = get_writer(fmt)
    real_write_metadata, real_fsync = writer_class._write_metadata, os.fsync

    def write_metadata(self, meta):  # Ctrl-C at the first fsync once the index is being written
        def interrupted(fd):
            if threading.current_thread() is not threading.main_thread():  # Ctrl-C reaches the main thread only
                return real_fsync(fd)
            monkeypatch.setattr(os, "fsync", real_fsync)
            raise KeyboardInterrupt

        monkeypatch.setattr(os, "fsync", interrupted)
        return real_write_metadata(self, meta)

    monkeypatch.setattr(writer_class, "_write_metadata", write_metadata)
    with pytest.raises(KeyboardInterrupt, match="18 of 18 inputs are saved"):  # the last checkpoint precedes the index
        convert(image_folder, tmp_path / name, format=fmt, image=ImageOptions(size=16), workers=1)
    monkeypatch.setattr(writer_class, "_write_metadata", real_write_metadata)
    report = convert(image_folder, tmp_path / name, format=fmt, image=ImageOptions(size=16), workers=1, resume=True)
    assert report.resumed == 18
    assert report.resumed_written == 18 and report.images_per_second == 0  # nothing left to convert: no rate to claim
    (meta, samples), (ref_meta, ref_samples) = read_plain(tmp_path / name), read_plain(reference.dst)
    assert samples == ref_samples and meta["count"] == ref_meta["count"] == 18


def test_workers_are_capped_by_the_memory_a_worker_may_need(image_folder, tmp_path, caplog, monkeypatch):
    """With the default --max-pixels a worker may need ~665 MB: 1.5 GB available holds two; a
    small --max-pixels lets every core work."""
    import packer.engine as engine
    import packer.parallel

    monkeypatch.setattr(engine, "available_memory", lambda: 1_500_000_000)
    monkeypatch.setattr(packer.parallel, "default_workers", lambda: 8)  # (the cores cap: parallel.workers_within_cores)
    report = convert(image_folder, tmp_path / "m.lmdb", image=ImageOptions(size=8), workers=8)
    assert report.workers == 2
    assert any("8 workers could each need" in r.getMessage() and "using 2" in r.getMessage() for r in caplog.records)
    report = convert(image_folder, tmp_path / "n.lmdb", image=ImageOptions(size=8, max_pixels=1_000_000), workers=8)
    assert report.workers == 8


def test_ctrl_c_while_the_output_is_renamed_is_reported_as_complete(image_folder, tmp_path, monkeypatch):
    """Found by benchmarks.faults: a Ctrl-C landing between the rename and the bookkeeping said
    "N inputs are saved; --resume", and the --resume it advised was refused (DST existed)."""
    import os
    import signal

    import packer.files as files  # where publish() renames
    import packer.writers.journal as journal
    from readers.formats import open_store

    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)

    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    real_replace = os.replace

    def replace_with_ctrl_c(src, dst):
        if str(dst).endswith("done.lmdb"):  # the publishing rename (journal commits rename too)
            os.kill(os.getpid(), signal.SIGINT)  # as if the user pressed Ctrl-C right now
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", replace_with_ctrl_c)
    dst = tmp_path / "done.lmdb"
    with pytest.raises(KeyboardInterrupt, match="interrupted after the output was complete"):
        convert(image_folder, dst, image=ImageOptions(size=8), workers=1)
    monkeypatch.setattr(files.os, "replace", real_replace)
    assert open_store(dst).meta.count == 18
    assert not journal_path(dst.with_name("done.lmdb.partial")).exists()


def test_the_summarys_command_is_quoted_for_a_shell(tmp_path):
    """A DST with spaces: "listed by: packer info out dir/bad x.h5" failed when pasted into a
    shell (a walkthrough); the path is quoted as a shell needs it."""
    import shlex

    from packer.report import ConversionReport
    from readers.schema import Skipped

    dst = tmp_path / "out dir ü" / "bad ✓.h5"
    report = ConversionReport(dst=dst, format="hdf5", inputs=2, written=1, skipped=[Skipped("a/b.jpg", "truncated")],
                              payload_bytes=10, seconds=1.0)
    command = report.summary().split("(listed by: ", 1)[1].rstrip(")")
    assert shlex.split(command) == ["packer", "info", str(dst)]
    # more than packer info lists: the command that lists them all (it named one cut at 20; a newcomer walkthrough)
    many = dataclasses.replace(report, skipped=[Skipped(f"a/{i}.jpg", "truncated") for i in range(21)])
    assert shlex.split(many.summary().split("(listed by: ", 1)[1].rstrip(")")) == ["packer", "info", "--json", str(dst)]


def test_skipped_inputs_past_fifty_are_counted_not_printed(tmp_path, caplog):
    """A dataset-wide mistake (pixels of the wrong dtype) printed one warning per sample: a
    million lines at ImageNet's size (a Streaming/LitData user's walkthrough). Each is recorded."""
    from packer.engine import SKIP_WARNINGS

    samples = [(np.zeros((4, 4, 3), np.uint8 if i == 0 else np.uint16), 0) for i in range(SKIP_WARNINGS + 10)]
    with caplog.at_level("WARNING", logger="packer"):
        report = convert(samples, tmp_path / "o.blob", workers=1)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped dataset[")]
    assert len(lines) == SKIP_WARNINGS + 1 and len(report.skipped) == SKIP_WARNINGS + 9 and report.written == 1
    assert lines[-1].endswith("; further skipped inputs are not printed one by one (the summary counts them, and the metadata "
                              "records each: packer info DST lists them)")


def test_the_command_counts_every_skipped_input_past_its_printed_warnings(tmp_path):
    """It printed 20, then '... and 31 more warnings' for 10,000 skips: the engine's own limit of
    50 hid the rest from its count (a scale walkthrough)."""
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i in range(70):
        (src / f"{i:03d}.jpg").write_bytes(b"junk")
    from imagefiles import gradient, jpeg_bytes

    (src / "good.jpg").write_bytes(jpeg_bytes(gradient(8, 8)))
    import logging

    assert not logging.getLogger("packer").isEnabledFor(logging.DEBUG)  # (cached: the command must clear it, a review)
    result = CliRunner().invoke(cli, ["convert", str(tmp_path / "src"), str(tmp_path / "o.lmdb")])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert sum(line.startswith("warning: skipped ") for line in lines) == 20 and "warning: ... and 50 more warnings" in lines, lines


def test_none_converted_names_the_most_common_reason_with_its_count(tmp_path):
    """Every image over --max-pixels and one unreadable file sorted first: the error said only
    "(first: a/corrupt.jpg: not a readable image ...)", not why the other images were skipped."""
    from packer.samples import make_image_folder

    src = make_image_folder(tmp_path / "src", classes=2, per_class=3, size=(40, 30))
    (src / "class_00" / "corrupt.jpg").write_bytes(b"not a jpeg")
    (src / "class_01" / "cut.jpg").write_bytes((src / "class_01" / "img_00000.jpg").read_bytes()[:60])
    result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "out.blob"), "--size", "16", "--max-pixels", "10", "-j", "1", "-q"])
    assert result.exit_code == 1, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"Error: {src}: none of the 8 images could be converted (most common, 6 of the 8: class_00/img_00000.jpg: "), line
    assert "more than --max-pixels 10; first: class_00/corrupt.jpg: not a readable image" in line, line
    # one kind of reason (numbers and details aside): said as before
    (src / "class_00" / "corrupt.jpg").unlink()
    (src / "class_01" / "cut.jpg").unlink()
    result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "out.blob"), "--size", "16", "--max-pixels", "10", "-j", "1", "-q"])
    assert "none of the 6 images could be converted (first: class_00/img_00000.jpg: 30x40 has 1,200 pixels, more than --max-pixels 10)" in result.stderr
