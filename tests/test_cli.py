"""The CLI as a user drives it: click's runner for the details, a real subprocess for the whole."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from imagefiles import gradient, jpeg_bytes, write
from packer.cli import cli
from readers import LMDBDataset


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_convert_then_info(tmp_path, image_folder):
    dst = tmp_path / "out.lmdb"
    result = run("convert", image_folder, dst, "--size", "24", "--workers", "2", "--quiet")
    assert result.exit_code == 0, result.output
    assert "wrote 18 images in 3 classes (3x24x24, raw)" in result.stdout and "img/s" in result.stdout
    assert len(LMDBDataset(dst)) == 18
    info = run("info", dst)
    assert info.exit_code == 0
    assert "samples    18" in info.stdout and "class_00, class_01, class_02" in info.stdout
    as_json = json.loads(run("info", dst, "--json").stdout)
    assert as_json["count"] == 18 and as_json["shape"] == [3, 24, 24] and as_json["bytes_on_disk"] > 18 * 3 * 24 * 24


def test_info_names_hdf5_compression(tmp_path, image_folder):
    """The filter was only in --json's extra (a walkthrough): the storage row names it."""
    assert run("convert", image_folder, tmp_path / "gz.h5", "--size", "8", "--compression", "gzip", "-q").exit_code == 0
    assert run("convert", image_folder, tmp_path / "plain.h5", "--size", "8", "-q").exit_code == 0
    assert "storage    uint8 CHW, raw, gzip compression" in run("info", tmp_path / "gz.h5").stdout
    assert "storage    uint8 CHW, raw\n" in run("info", tmp_path / "plain.h5").stdout


def test_info_says_what_shorter_and_jpeg_quality_did(tmp_path, image_folder):
    """'size 224x224, shorter' for shapes that vary, and no JPEG quality (a walkthrough)."""
    assert run("convert", image_folder, tmp_path / "s.lmdb", "--size", "8", "--resize-mode", "shorter", "-q").exit_code == 0
    assert "preprocess shorter side to 8 (the other follows its aspect ratio), RGB" in run("info", tmp_path / "s.lmdb").stdout
    assert run("convert", image_folder, tmp_path / "j.lmdb", "--size", "8", "--encoding", "jpeg", "--quality", "80", "-q").exit_code == 0
    assert "storage    uint8 CHW, jpeg (quality 80)\n" in run("info", tmp_path / "j.lmdb").stdout


def test_format_flag_and_options(tmp_path, image_folder):
    dst = tmp_path / "noext"
    result = run("convert", image_folder, dst, "--format", "lmdb", "--size", "16x24", "--resize-mode", "pad", "--grayscale", "--encoding", "png", "-q")
    assert result.exit_code == 0, result.output
    meta = LMDBDataset(dst).meta
    assert (meta.shape, meta.encoding) == ((1, 16, 24), "png")


def test_a_shard_pattern_names_a_webdataset_output(tmp_path, image_folder):
    """``folder/name-%06d.tar`` selects WebDataset without --format (README: WebDataset's DST)."""
    import tarfile

    result = run("convert", image_folder, tmp_path / "wds" / "train-%06d.tar", "--size", "8", "-q")
    assert result.exit_code == 0, result.output
    [shard] = sorted((tmp_path / "wds").glob("train-*.tar"))
    with tarfile.open(shard) as tar:  # the plain library reads what was written
        assert len({Path(m.name).name.split(".")[0] for m in tar.getmembers()}) == 18


def test_a_source_one_level_too_high_is_warned_about(tmp_path, image_folder):
    """``imagenet/`` holding ``train/``, whose sub-folders are the classes: one class, label 0 for
    every sample, said at once (a new user found out only from `packer info`)."""
    import shutil

    shutil.copytree(image_folder, tmp_path / "imagenet" / "train")
    result = run("convert", tmp_path / "imagenet", tmp_path / "whole.lmdb", "--size", "8", "-j", "1")
    assert result.exit_code == 0, result.output
    assert "every sample gets label 0" in result.stderr and f"convert {tmp_path / 'imagenet'}/train instead" in result.stderr
    assert list(LMDBDataset(tmp_path / "whole.lmdb").meta.classes) == ["train"]  # converted as asked, only warned
    right = run("convert", tmp_path / "imagenet" / "train", tmp_path / "right.lmdb", "--size", "8", "-j", "1")
    assert right.exit_code == 0 and "warning" not in right.stderr



def test_the_quiet_summary_says_how_many_classes(tmp_path, image_folder):
    """--quiet hides the one-class warning: the summary line said only "wrote 18 images (...)", so
    a scripted run of a SRC one level too high (or without class folders) showed nothing amiss."""
    import shutil

    shutil.copytree(image_folder, tmp_path / "imagenet" / "train")
    lines = {}
    for name, src, extra in [("high", tmp_path / "imagenet", []), ("flat", image_folder / "class_01", []),
                             ("ints", tmp_path / "flat", ["--labels", tmp_path / "labels.csv"])]:
        if name == "ints":
            shutil.copytree(image_folder / "class_01", src)
            (tmp_path / "labels.csv").write_text("path,label\n" + "".join(f"{p.name},{i % 2}\n" for i, p in enumerate(sorted(src.iterdir()))))
        result = run("convert", src, tmp_path / f"{name}.blob", "--size", "8", "-j", "1", "-q", *extra)
        assert result.exit_code == 0, result.output
        assert result.stderr == "", result.stderr
        lines[name] = result.stdout
    assert lines["high"].startswith("wrote 18 images in 1 class (3x8x8, raw) to "), lines["high"]
    assert lines["flat"].startswith("wrote 6 images, unlabeled (3x8x8, raw) to "), lines["flat"]
    assert lines["ints"].startswith("wrote 6 images with integer labels (3x8x8, raw) to "), lines["ints"]


def test_a_packer_dataset_beside_the_class_folders_is_no_class(tmp_path, image_folder):
    """``imagenet/train.lmdb`` written beside ``imagenet/train/``, then ``imagenet/`` converted
    (a newcomer's walkthrough): the LMDB folder became a second class, label 0 went to every
    image and the one-level-too-high warning was not given. A packer dataset (finished or
    ``.partial``) is left out, said, and the warning comes."""
    import shutil

    shutil.copytree(image_folder, tmp_path / "imagenet" / "train")
    assert run("convert", tmp_path / "imagenet" / "train", tmp_path / "imagenet" / "train.lmdb", "--size", "8", "-j", "1").exit_code == 0
    (tmp_path / "imagenet" / "old.blob.partial").mkdir()
    result = run("convert", tmp_path / "imagenet", tmp_path / "whole.lmdb", "--size", "8", "-j", "1")
    assert result.exit_code == 0, result.output
    assert "'train.lmdb' left out: a packer dataset (or an unfinished conversion), not a class folder" in result.stderr
    assert "'old.blob.partial' left out" in result.stderr and "has no images" not in result.stderr
    assert f"convert {tmp_path / 'imagenet'}/train instead" in result.stderr
    assert list(LMDBDataset(tmp_path / "whole.lmdb").meta.classes) == ["train"]

def test_head_on_an_image_dataset_names_preview(tmp_path, image_folder):
    dst = tmp_path / "i.lmdb"
    assert run("convert", image_folder, dst, "--size", "8", "-q").exit_code == 0
    result = run("head", dst)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert f"an image dataset (18 samples) has no documents to print: see a contact sheet of its samples with: packer preview {dst}" in result.stderr


def test_progress_bar_and_summary(tmp_path, image_folder, monkeypatch):
    from packer import progress

    quiet = run("convert", image_folder, tmp_path / "q.lmdb", "--size", "8", "-j", "1")  # (stderr no terminal: no bar frames)
    assert quiet.exit_code == 0 and "/18 [" not in quiet.stderr and "\r" not in quiet.stderr
    monkeypatch.setattr(progress, "_is_terminal", lambda stream: True)
    result = run("convert", image_folder, tmp_path / "p.lmdb", "--size", "8", "-j", "1")
    assert result.exit_code == 0
    assert "/18 [" in result.stderr and "img/s" in result.stderr  # the bar, on stderr
    assert result.stdout.count("\n") == 2 and result.stdout.startswith("wrote 18 images")  # the summary, then what to do next


@pytest.mark.parametrize(
    "args, message, code",
    [
        (["convert", "{tmp}/missing", "{tmp}/o.lmdb"], "no such folder", 1),
        (["convert", "{tmp}/e6.lmdb", "{src}"], "no such folder or file, and DST", 1),  # SRC and DST swapped
        (["convert", "{tmp}/empty", "{tmp}/o.lmdb"], "is empty", 1),
        (["convert", "{src}", "{tmp}/o.zip"], "cannot tell the format", 2),
        (["convert", "{src}", "{tmp}/e.lmdb", "--format", "hdf5"], "the name says lmdb but --format is hdf5", 2),
        (["convert", "{src}", "{tmp}/x-%06d.tar", "--format", "blob"], "the name says webdataset but --format is blob", 2),
        (["convert", "{src}", "{tmp}/o.lmdb", "--size", "big"], "N or HxW", 2),
        (["convert", "{src}", "{tmp}/o.lmdb", "--resize-mode", "pad"], "needs --size", 2),
        (["convert", "{src}", "{tmp}/o.lmdb", "--format", "zip"], "Invalid value for '--format'", 2),
        (["convert", "{src}", "{tmp}/o.lmdb", "--workers", "0"], "Invalid value for '--workers'", 2),
        (["convert", "{src}", "{tmp}/nodir/o.lmdb"], "does not exist; create it first", 1),
        (["info", "{tmp}/missing.lmdb"], "no such packed dataset", 1),
        (["info", "{tmp}/missing.lmdb.partial"], "no such packed dataset", 1),  # (not "an unfinished conversion")
        (["info", "{tmp}/half.lmdb"], "half.lmdb.partial is an unfinished conversion: run the same packer convert command again, with --resume", 1),
        (["info", "{tmp}/empty"], "not a packer dataset", 1),
    ],
)
def test_user_mistakes_are_one_line_errors(tmp_path, image_folder, args, message, code):
    (tmp_path / "empty").mkdir()
    (tmp_path / "half.lmdb.partial").mkdir()
    args = [a.format(tmp=tmp_path, src=image_folder) for a in args]
    result = run(*args)
    assert result.exit_code == code, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ") and message in last  # one line (click adds a usage hint above parse errors)
    assert "Traceback" not in result.output


def test_existing_output_is_refused_unless_overwrite(tmp_path, image_folder):
    dst = tmp_path / "o.lmdb"
    assert run("convert", image_folder, dst, "--size", "8", "-q").exit_code == 0
    again = run("convert", image_folder, dst, "--size", "12", "-q")
    assert again.exit_code == 1 and "already exists; pass --overwrite" in again.stderr
    assert LMDBDataset(dst).meta.shape == (3, 8, 8)  # untouched
    assert run("convert", image_folder, dst, "--size", "12", "-q", "--overwrite").exit_code == 0
    assert LMDBDataset(dst).meta.shape == (3, 12, 12)


def test_bad_files_are_skipped_warned_and_recorded(tmp_path):
    src = tmp_path / "src"
    good = jpeg_bytes(gradient(20, 20))
    write(src / "a/good.jpg", good)
    write(src / "a/truncated.jpg", good[: len(good) // 2])
    write(src / "b/empty.jpg", b"")
    write(src / "b/text.png", b"this is not a png")
    write(src / "b/good.jpg", good)
    dst = tmp_path / "o.lmdb"
    result = run("convert", src, dst, "--size", "8")
    assert result.exit_code == 0, result.output
    assert "wrote 2 images" in result.stdout and "skipped 3" in result.stdout
    for name in ("a/truncated.jpg", "b/empty.jpg", "b/text.png"):
        assert f"warning: skipped {name}" in result.stderr
    meta = LMDBDataset(dst).meta
    assert {s.path for s in meta.skipped} == {"a/truncated.jpg", "b/empty.jpg", "b/text.png"}
    assert "empty file" in {s.path: s.reason for s in meta.skipped}["b/empty.jpg"]
    assert "a/truncated.jpg" in run("info", dst).stdout

    failing = run("convert", src, tmp_path / "f.lmdb", "--size", "8", "--on-error", "fail", "-j", "1")
    assert failing.exit_code == 1
    assert "truncated.jpg" in failing.stderr and "--on-error skip" in failing.stderr
    assert not (tmp_path / "f.lmdb").exists() and not (tmp_path / "f.lmdb.partial").exists()


def test_all_inputs_bad_is_an_error(tmp_path):
    write(tmp_path / "src/a/x.jpg", b"nope")
    result = run("convert", tmp_path / "src", tmp_path / "o.lmdb", "-q")
    assert result.exit_code == 1 and "src: its one image could not be converted (first: a/x.jpg: " in result.stderr
    assert "warning" not in result.stderr  # --quiet: the error line only
    assert not (tmp_path / "o.lmdb").exists()


def test_warnings_past_the_limit_are_counted_once_even_when_the_conversion_fails(tmp_path):
    """Every input skipped: 20 warnings, one line counting the rest, then the error. The count
    was printed again after the error (logging closes the handlers still alive at exit)."""
    for i in range(25):
        write(tmp_path / f"src/a/{i}.jpg", b"nope")
    done = subprocess.run([sys.executable, "-m", "packer", "convert", str(tmp_path / "src"), str(tmp_path / "o.lmdb"), "-j", "1"],
                          capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and lines[-1].startswith("Error: ") and "none of the 25 images" in lines[-1], done.stderr
    assert sum("more warnings" in line for line in lines) == 1 and "and 5 more warnings" in lines[-2]


def test_as_a_subprocess(tmp_path, image_folder):
    dst = tmp_path / "sub.lmdb"
    env = dict(os.environ, PYTHONWARNINGS="error::DeprecationWarning")
    done = subprocess.run([sys.executable, "-m", "packer", "convert", str(image_folder), str(dst), "--size", "16"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "wrote 18 images" in done.stdout
    info = subprocess.run([sys.executable, "-m", "packer", "info", str(dst)], capture_output=True, text=True)
    assert info.returncode == 0 and "samples    18" in info.stdout
    missing = subprocess.run([sys.executable, "-m", "packer", "convert", str(tmp_path / "nope"), str(dst)], capture_output=True, text=True)
    assert missing.returncode == 1 and missing.stderr.startswith("Error: ") and "Traceback" not in missing.stderr


def test_an_interruption_raised_as_the_conversion_ends_says_the_output_is_finished(image_folder, tmp_path, monkeypatch):
    """An interruption Python swallowed is raised as the command's block ends (packer/interrupts.py):
    when the conversion had finished by then, the message says the output is complete."""
    from contextlib import contextmanager

    import packer.cli

    @contextmanager
    def interrupted_as_it_ends():
        yield
        raise KeyboardInterrupt

    monkeypatch.setattr(packer.cli, "interruptible", interrupted_as_it_ends)
    dst = tmp_path / "out.lmdb"
    result = run("convert", image_folder, dst, "--size", "16")
    assert result.exit_code == 130, result.output
    assert f"interrupted after the output was complete: {dst} is finished" in result.output
    assert len(LMDBDataset(dst)) == 18


def test_sigterm_stops_verify_as_ctrl_c_does(image_folder, tmp_path, monkeypatch):
    """packer verify (whose --source runs a pool of workers) takes SIGTERM as an interruption:
    one line, exit 130, as for Ctrl-C (before, SIGTERM killed it outright)."""
    import signal

    import packer.verify

    dst = tmp_path / "out.lmdb"
    assert run("convert", image_folder, dst, "--size", "16").exit_code == 0

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10**7):
            pass
        raise AssertionError("SIGTERM did not interrupt verify")

    def not_taken(signum, frame):  # (if verify does not take SIGTERM: a failure, not a killed test run)
        raise AssertionError("verify did not take SIGTERM")

    monkeypatch.setattr(packer.verify, "verify", terminated)
    previous = signal.signal(signal.SIGTERM, not_taken)
    try:
        result = run("verify", dst, "--source", image_folder)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 130 and "interrupted" in result.output, (result.output, result.exception)


def test_sample_images_for_a_first_try(tmp_path):
    """README: ``python -m packer.samples DIR`` writes class folders of JPEGs that convert."""
    from PIL import Image

    done = subprocess.run([sys.executable, "-m", "packer.samples", str(tmp_path / "imgs"), "--classes", "2", "--per-class", "3",
                           "--size", "30x40"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "wrote 6 JPEGs in 2 class folders" in done.stdout, done.stderr
    files = sorted((tmp_path / "imgs").rglob("*.jpg"))
    assert [f.relative_to(tmp_path / "imgs").as_posix() for f in files[:2]] == ["class_00/img_00000.jpg", "class_00/img_00001.jpg"]
    with Image.open(files[0]) as image:
        assert (image.format, image.size) == ("JPEG", (40, 30))
    assert run("convert", tmp_path / "imgs", tmp_path / "s.lmdb", "--size", "8", "-q").exit_code == 0
    bad = subprocess.run([sys.executable, "-m", "packer.samples", str(tmp_path / "x"), "--size", "12"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith("HEIGHTxWIDTH, for example 375x500, not '12'")


def test_a_shard_pattern_reads_back_as_it_was_written(tmp_path, image_folder):
    """The DST string convert took (``wds/train-%06d.tar``) opens the dataset: open_dataset and
    ShardDataset said 'no such packed dataset'."""
    from readers import ShardDataset, open_dataset

    pattern = tmp_path / "wds" / "train-%06d.tar"
    assert run("convert", image_folder, pattern, "--size", "8", "-q").exit_code == 0
    assert len(open_dataset(pattern)) == len(ShardDataset(pattern)) == 18
    assert run("info", pattern).exit_code == 0


def test_a_shard_name_with_a_space_streams_and_space_padding_is_refused(tmp_path, image_folder):
    """``my train-%06d.tar`` converted, and StreamingShards refused its shards as not listed (it
    took a URL's last word, for ``pipe:``); ``%6d`` names shards ``t-     0.tar``, which no brace
    pattern names: refused in one line, before anything is written."""
    from readers import StreamingShards

    pattern = tmp_path / "wds" / "my train-%06d.tar"
    assert run("convert", image_folder, pattern, "--size", "8", "-q").exit_code == 0
    for given in (pattern.parent, pattern, tmp_path / "wds" / "my train-{000000..000000}.tar"):
        assert len(list(StreamingShards(str(given)))) == 18
    result = run("convert", image_folder, tmp_path / "spaced" / "t-%6d.tar", "--size", "8")
    assert result.exit_code != 0 and not (tmp_path / "spaced").exists()
    assert "pads the shard number with spaces; pad it with zeros, for example t-%06d.tar" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_progress_in_a_log_is_whole_lines(monkeypatch):
    """Piped into a log, tqdm's frames ("\\r" each) piled up between the warnings (a walkthrough):
    off a terminal, progress is a whole line every LOG_LINE_SECONDS, with the rate and time left."""
    import io

    from packer import progress

    clock = iter([0.0, 10.0, 31.0, 40.0, 62.0, 70.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    log = io.StringIO()
    with progress.progress_bar(100, enabled=True, unit="img", stream=log) as bar:
        for _ in range(5):
            bar.update(10)
    assert "\r" not in log.getvalue()
    assert log.getvalue().splitlines() == ["progress: 20 of 100 img (20%), 1 img/s, about 2m04s left",
                                           "progress: 40 of 100 img (40%), 1 img/s, about 1m33s left"]


@pytest.mark.parametrize("url", ["http://127.0.0.1:8765/shards", "s3://bucket/train.lmdb"])
def test_a_remote_url_is_named_with_what_reads_it(url):
    """open_dataset("http://host/shards") said "http:/host/shards: no such packed dataset" (the //
    folded by Path; a walkthrough): the URL is named as it was given, with the reader that streams it.
    (packer info and verify read a URL in place: tests/test_remote_info.py; head does not.)"""
    from readers import open_dataset
    from readers.schema import PackedFormatError

    with pytest.raises(PackedFormatError, match=rf"^{re.escape(url)}: a \w+:// URL; .*readers.StreamingShards"):
        open_dataset(url)
    result = run("head", url)
    assert result.exit_code == 1 and result.output.strip().startswith(f"Error: {url}: a "), result.output


@pytest.mark.parametrize("dst_name", ["out.lmdb", "out.h5", "out.blob", "shards/s-%03d.tar", "words.blob"])
def test_the_line_after_the_summary_reads_and_shows_the_output(tmp_path, image_folder, dst_name) -> None:
    """What a newcomer does next, from the output's own line: the Python reads every sample and
    the command shows some (its summary said how many, but not how to read them)."""
    import readers

    src = image_folder
    if dst_name.startswith("words"):
        src = tmp_path / "corpus"
        src.mkdir()
        (src / "a.txt").write_text("one document\n\nanother one\n")
    dst = tmp_path / dst_name
    result = run("convert", src, dst, "--workers", "1", *(["--size", "8"] if src == image_folder else ["--lines"]))
    assert result.exit_code == 0, result.output
    summary, steps = result.stdout.splitlines()[-2:]
    written = int(re.search(r"wrote (\d+)", summary).group(1))
    code, streamed, braces, command = re.fullmatch(r"read it: (readers\.\w+\([^)]*\))(?:; stream it: (readers\.StreamingShards\([^)]*\)), "
                                                   r"or webdataset's '([^']*)' \(1 shard\))?; see it: packer (.*)", steps).groups()
    assert len(eval(code, {"readers": readers})) == written  # noqa: S307 - the line is meant to be pasted
    if dst_name.endswith(".tar"):  # a WebDataset's streamed too, and named as webdataset reads it
        import webdataset as wds

        assert len(list(eval(streamed, {"readers": readers}))) == len(list(wds.WebDataset(braces, shardshuffle=False))) == written  # noqa: S307
    words = command.split()
    shown = run(words[0], *words[1:], *(["-o", tmp_path / "sheet.png"] if words[0] == "preview" else []))
    assert shown.exit_code == 0, shown.output
    assert "read it:" not in run("convert", src, dst, "--overwrite", "-q", "--workers", "1",
                                 *(["--size", "8"] if src == image_folder else ["--lines"])).stdout


def test_the_lines_after_a_url_dst_name_what_reads_a_url() -> None:
    """They named readers.ShardDataset('s3://.../train-%06d.tar'), packer preview and packer info
    of the URL, which all refuse URLs (an S3 walkthrough)."""
    from packer.report import ConversionReport
    from readers.schema import Skipped

    for dst, fmt, steps in [
        ("s3://b/out/train-%06d.tar", "webdataset", "read it: readers.StreamingShards('s3://b/out')"),
        ("s3://b/out", "webdataset", "read it: readers.StreamingShards('s3://b/out')"),
        ("s3://b/x.blob", "blob", "read it: copy it to a local disk, then readers.RAMDataset(its local path)"),
    ]:
        report = ConversionReport(dst, fmt, 3, 2, [Skipped("a.jpg", "bad")])
        assert report.next_steps() == steps and report.summary().endswith("skipped 1 (listed in its metadata)")
