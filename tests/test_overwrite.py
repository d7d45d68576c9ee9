"""--overwrite replaces only a packer dataset, and DST never overlaps SRC (issue 14, item 1).

Each refusal leaves every file where it was: the tests compare the whole tree before and after.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer import ImageOptions, convert
from packer.cli import cli
from packer.errors import OptionError, OutputError, OutputExistsError
from readers.formats import open_store


def tree(root: Path) -> dict[str, str]:
    """Every file below ``root`` (or ``root`` itself) with a digest of its bytes."""
    if root.is_file():
        return {root.name: hashlib.sha256(root.read_bytes()).hexdigest()}
    return {
        os.path.relpath(os.path.join(d, f), root): hashlib.sha256(Path(d, f).read_bytes()).hexdigest()
        for d, _, files in os.walk(root)
        for f in files
    }


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def src(tmp_path, image_folder) -> Path:
    copy = tmp_path / "s"
    shutil.copytree(image_folder, copy)
    return copy


@pytest.mark.parametrize("fmt", ["webdataset", "lmdb", "blob"])
def test_dst_equal_to_src_is_refused_even_with_overwrite(src, fmt):
    before = tree(src)
    result = run("convert", src, src, "-f", fmt, "--size", "8", "--overwrite", "-q")
    assert result.exit_code == 2, result.output
    assert "source folder itself" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert tree(src) == before


def test_dst_containing_src_is_refused_even_with_overwrite(src, tmp_path):
    before = tree(tmp_path)
    result = run("convert", src, tmp_path, "-f", "webdataset", "--size", "8", "--overwrite", "-q")
    assert result.exit_code == 2 and "contains the source" in result.stderr
    assert tree(tmp_path) == before


def test_dst_inside_src_is_refused(src):
    before = tree(src)
    with pytest.raises(OptionError, match="inside the source"):
        convert(src, src / "class_00" / "out.lmdb", image=ImageOptions(size=8), workers=1, overwrite=True)
    with pytest.raises(OptionError, match="inside the source"):  # a shard pattern names a folder inside SRC
        convert(src, src / "shards" / "train-%06d.tar", format="webdataset", image=ImageOptions(size=8), workers=1)
    assert tree(src) == before


def test_dst_reached_through_a_symlink_to_src_is_refused(src, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(src, target_is_directory=True)
    with pytest.raises(OptionError, match="source folder itself"):
        convert(src, link, format="webdataset", image=ImageOptions(size=8), workers=1, overwrite=True)
    assert link.is_symlink() and tree(src)


def test_overwrite_refuses_a_folder_of_user_files(src, tmp_path, image_folder):
    user = tmp_path / "photos"
    shutil.copytree(image_folder / "class_00", user)
    before = tree(user)
    result = run("convert", src, user, "-f", "webdataset", "--size", "8", "--overwrite", "-q")
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "is not a packer dataset (a folder holding 6 files" in line and "--overwrite replaces only a packer dataset" in line
    assert tree(user) == before
    # Without --overwrite it is said at once: "pass --overwrite to replace it" led only to this line (a newcomer's walkthrough)
    plain = run("convert", src, user, "-f", "webdataset", "--size", "8", "-q")
    assert plain.exit_code == 1 and "is not a packer dataset (a folder holding 6 files" in plain.stderr and "pass --overwrite" not in plain.stderr
    assert tree(user) == before
    # A shard pattern into it: the shards need a folder of their own (it spoke of --overwrite; a fault sweep)
    for flags in ([], ["--overwrite"]):
        pattern = run("convert", src, user / "train-%06d.tar", "--size", "8", "-q", *flags)
        assert pattern.exit_code == 1 and pattern.stderr == (
            f"Error: {user}: holds files that are not a packer dataset (a folder holding 6 files, for example 'img_00000.jpg'); "
            f"WebDataset shards are written into a folder of their own, new or empty: for example {user}/shards/train-%06d.tar\n"), pattern.stderr
        assert tree(user) == before


@pytest.mark.parametrize("name", ["data.lmdb", "data.blob", "data.h5"])
def test_overwrite_refuses_a_file_that_only_looks_like_a_dataset(src, tmp_path, name):
    dst = tmp_path / name
    if name == "data.lmdb":
        dst.mkdir()
        (dst / "data.mdb").write_bytes(b"my own lmdb, not packer's")
    else:
        dst.write_bytes(b"PACKBLOB but not really" if name.endswith(".blob") else b"\x89HDF\r\n\x1a\n not really")
    before = tree(dst)
    with pytest.raises(OutputExistsError, match="is not a packer dataset"):
        convert(src, dst, image=ImageOptions(size=8), workers=1, overwrite=True)
    assert tree(dst) == before


@pytest.mark.parametrize("fmt, name", [("lmdb", "d.lmdb"), ("hdf5", "d.h5"), ("blob", "d.blob"), ("webdataset", "d")])
def test_overwrite_replaces_a_packer_dataset(src, tmp_path, fmt, name):
    dst = tmp_path / name
    convert(src, dst, format=fmt, image=ImageOptions(size=8), workers=1)
    assert open_store(dst).meta.shape == (3, 8, 8)
    convert(src, dst, format=fmt, image=ImageOptions(size=12), workers=1, overwrite=True)
    assert open_store(dst).meta.shape == (3, 12, 12)


@pytest.mark.parametrize("fmt, name", [("lmdb", "d.lmdb"), ("webdataset", "d")])
@pytest.mark.parametrize("resume", [False, True])
def test_overwrite_refuses_a_dataset_folder_holding_user_files(src, tmp_path, fmt, name, resume):
    """A folder dataset with the user's own file put in it (notes beside the shards) read as a
    packer dataset, and --overwrite deleted the file with the folder (a fault sweep, 2 of 2)."""
    dst = tmp_path / name
    convert(src, dst, format=fmt, image=ImageOptions(size=8), workers=1)
    (dst / "NOTES.md").write_text("mine")
    before = tree(dst)
    result = CliRunner().invoke(cli, ["convert", str(src), str(dst), "--format", fmt, "--size", "12", "--overwrite",
                                      *(["--resume"] if resume else [])])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"{dst}: a packer dataset that also holds files packer did not write (NOTES.md); --overwrite would delete" in result.stderr
    assert tree(dst) == before
    (dst / "NOTES.md").unlink()  # what the format wrote only: replaced
    convert(src, dst, format=fmt, image=ImageOptions(size=12), workers=1, overwrite=True)
    assert open_store(dst).meta.shape == (3, 12, 12) and open_store(dst).foreign_content() == []


@pytest.mark.parametrize("added", ["dataset", "group", "attribute", "dataset attribute", "dangling link"])
def test_overwrite_refuses_an_hdf5_file_the_user_added_to(src, tmp_path, added):
    """A packer .h5 with the user's own embeddings (or an attribute) added with h5py read as a
    packer dataset, and --overwrite deleted them with the file (a walkthrough): refused in one
    line naming what was added, the file untouched; once it is removed again, replaced."""
    import h5py
    import numpy as np

    dst = tmp_path / "mine.h5"
    convert(src, dst, image=ImageOptions(size=8), workers=1)
    with h5py.File(dst, "r+") as file:
        if added == "dataset":
            file.create_dataset("my_embeddings", data=np.zeros((18, 4), "f4"))
        elif added == "group":
            file.create_group("analysis")
        elif added == "attribute":
            file.attrs["experiment"] = "run 7"
        elif added == "dangling link":  # (looked up, it raised KeyError: a traceback; a review)
            file["elsewhere"] = h5py.ExternalLink("gone.h5", "/data")
        else:
            file["labels"].attrs["note"] = "checked by hand"
    named = {"dataset": "dataset 'my_embeddings'", "group": "group 'analysis'", "attribute": "attribute 'experiment'",
             "dataset attribute": "attribute 'note' of 'labels'", "dangling link": "external link 'elsewhere'"}[added]
    before = hashlib.sha256(dst.read_bytes()).hexdigest()
    result = CliRunner().invoke(cli, ["convert", str(src), str(dst), "--size", "12", "--overwrite"])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"{dst}: a packer dataset that also holds content packer did not write ({named}); --overwrite would delete" in result.stderr
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == before
    with h5py.File(dst, "r+") as file:
        if added == "dataset":
            del file["my_embeddings"]
        elif added == "group":
            del file["analysis"]
        elif added == "attribute":
            del file.attrs["experiment"]
        elif added == "dangling link":
            del file["elsewhere"]
        else:
            del file["labels"].attrs["note"]
    convert(src, dst, image=ImageOptions(size=12), workers=1, overwrite=True)
    assert open_store(dst).meta.shape == (3, 12, 12)


def test_overwrite_refuses_an_lmdb_the_user_added_keys_to(src, tmp_path):
    """Keys put into a packer LMDB with py-lmdb (the user's own records) are named, not deleted."""
    import lmdb

    dst = tmp_path / "mine.lmdb"
    convert(src, dst, image=ImageOptions(size=8), workers=1)
    env = lmdb.open(str(dst), subdir=True, lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"my-note", b"keep me")
        txn.put(b"my-other-note", b"and me")
    env.close()
    result = CliRunner().invoke(cli, ["convert", str(src), str(dst), "--size", "12", "--overwrite"])
    assert result.exit_code == 1 and "holds content packer did not write (2 LMDB keys packer did not write)" in result.stderr
    env = lmdb.open(str(dst), subdir=True, lock=False, readonly=True)
    with env.begin() as txn:
        assert txn.get(b"my-note") == b"keep me"
    env.close()


@pytest.mark.parametrize("overwrite", [True, False])
@pytest.mark.parametrize("fmt", ["webdataset", "blob"])
def test_an_empty_folder_is_taken_with_or_without_overwrite(src, tmp_path, fmt, overwrite):
    """An empty folder holds nothing to lose: a WebDataset user often makes the output folder
    first. A single-file format replaces it with the file."""
    dst = tmp_path / "empty"
    dst.mkdir()
    convert(src, dst, format=fmt, image=ImageOptions(size=8), workers=1, overwrite=overwrite)
    assert open_store(dst).meta.count == 18 and dst.is_dir() == (fmt == "webdataset")
    with pytest.raises(OutputExistsError, match="already exists; pass --overwrite"):  # now it is not empty
        convert(src, dst, format=fmt, image=ImageOptions(size=8), workers=1)


def test_overwrite_of_a_remote_dst_refuses_user_objects(s3, src):
    s3.pipe({"packer-test/mine/notes.txt": b"my notes", "packer-test/mine.blob": b"not a blob"})
    with pytest.raises(Exception, match="is not a packer dataset"):
        convert(src, "s3://packer-test/mine", format="webdataset", image=ImageOptions(size=8), workers=1, overwrite=True)
    with pytest.raises(Exception, match="is not a packer dataset"):
        convert(src, "s3://packer-test/mine.blob", image=ImageOptions(size=8), workers=1, overwrite=True)
    assert s3.cat("packer-test/mine/notes.txt") == b"my notes" and s3.cat("packer-test/mine.blob") == b"not a blob"
    convert(src, "s3://packer-test/ours", format="webdataset", image=ImageOptions(size=8), workers=1)
    report = convert(src, "s3://packer-test/ours", format="webdataset", image=ImageOptions(size=12), workers=1, overwrite=True)
    assert report.shape == (3, 12, 12)
    # a packer dataset the user put a file into: kept, as a local DST is (it was removed with the folder; an S3 walkthrough)
    s3.pipe({"packer-test/ours/README.txt": b"user readme"})
    with pytest.raises(Exception, match=r"s3://packer-test/ours: a packer dataset that also holds files packer did not write \(README.txt\)"):
        convert(src, "s3://packer-test/ours", format="webdataset", image=ImageOptions(size=8), workers=1, overwrite=True)
    assert s3.cat("packer-test/ours/README.txt") == b"user readme" and s3.exists("packer-test/ours/packer.json")


def test_a_remote_dst_that_cannot_be_looked_at_is_one_line(s3, src, monkeypatch):
    """Wrong credentials: a 40-line traceback ending in PermissionError (an S3 walkthrough)."""
    import packer.remote as remote

    class Forbidden:
        def exists(self, path):
            raise PermissionError("Forbidden")

    monkeypatch.setattr(remote, "dst_filesystem", lambda url: (Forbidden(), "packer-test/x"))
    result = CliRunner().invoke(cli, ["convert", str(src), "s3://packer-test/x/train-%06d.tar", "--size", "8", "-q"])
    assert result.exit_code == 1 and result.stderr == (
        "Error: s3://packer-test/x/train-%06d.tar: cannot look there (PermissionError: Forbidden); check the URL and the credentials\n"), result.output


SLOW_ADD = "import time, packer.writers.base as b; add = b.Writer.add; b.Writer.add = lambda s, x: (time.sleep(0.05), add(s, x))[1]"


@pytest.mark.parametrize("extra", [[], ["--resume"], ["--overwrite"]])
def test_leftovers_of_a_run_killed_after_it_published_are_removed_by_the_next_command(src, tmp_path, extra):
    """A kill between the rename to DST and the cleanup left the lock file (its pid) and an empty
    journal beside the finished DST for good: a rerun, --resume and --overwrite all passed them
    by (a fault sweep, 18 of 37 such kills)."""
    dst = tmp_path / "d.lmdb"
    convert(src, dst, image=ImageOptions(size=8), workers=1)
    (tmp_path / "d.lmdb.partial-lock").write_text("packer-lock 999999\n")  # as the killed run left them
    (tmp_path / "d.lmdb.partial-journal").mkdir()
    for name in ("names.jsonl", "samples.i64"):
        (tmp_path / "d.lmdb.partial-journal" / name).write_bytes(b"")
    result = CliRunner().invoke(cli, ["convert", str(src), str(dst), "--size", "8", "-q", *extra])
    assert result.exit_code == (0 if extra == ["--overwrite"] else 1), result.output
    assert sorted(p.name for p in tmp_path.iterdir() if p != src) == ["d.lmdb"] and open_store(dst).meta.count == 18


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_sigkilled_conversions_lock_file_never_blocks_or_confuses_a_later_run(image_folder, tmp_path, checkpointed):
    """SIGKILL leaves the empty ``DST.partial-lock`` (the flock goes with the process): readers
    and ``packer info`` name the unfinished conversion, not the lock; the next run is refused only
    for a checkpoint it could resume (never "another conversion is writing it"); --resume, or a
    plain run when nothing was saved, takes the lock over, finishes, and leaves no lock file."""
    import sys

    from checkpoints import convert_until_checkpoint
    from readers.schema import IncompleteDatasetError

    dst = tmp_path / "d.lmdb"
    lock, journal = tmp_path / "d.lmdb.partial-lock", tmp_path / "d.lmdb.partial-journal" / "journal.json"
    args = ["convert", str(image_folder), str(dst), "--size", "8", "-j", "1", "-q"]
    if checkpointed:
        assert convert_until_checkpoint(args, journal, setup=SLOW_ADD) > 0
    else:  # killed before its first checkpoint: the lock file is there, the journal holds nothing
        import signal
        import subprocess
        import time

        child = f"{SLOW_ADD}; import packer.writers.journal as j; j.CHECKPOINT_SECONDS = 1e9; from packer.cli import cli; cli({args!r})"
        proc = subprocess.Popen([sys.executable, "-c", child], start_new_session=True)
        while not (tmp_path / "d.lmdb.partial" / "data.mdb").exists():
            assert proc.poll() is None
            time.sleep(0.01)
        time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert lock.exists() and not dst.exists()
    with pytest.raises(IncompleteDatasetError, match="d.lmdb.partial is an unfinished conversion"):
        open_store(dst)
    info = run("info", dst)
    assert info.exit_code == 1 and "unfinished conversion" in info.output and "lock" not in info.output
    again = run(*args)
    if checkpointed:
        assert again.exit_code == 1 and "--resume" in again.output and "another packer conversion" not in again.output
        assert lock.exists() and journal.exists()  # the refusal touched nothing
        again = run(*args, "--resume")
    assert again.exit_code == 0, again.output
    assert open_store(dst).meta.count == 18 and not lock.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.lmdb"]


def test_a_file_url_dst_follows_the_local_rules(src, tmp_path):
    """As for a local DST: an empty folder is taken (a WebDataset DST), and --resume of a
    finished one says it is complete."""
    empty = tmp_path / "empty"
    empty.mkdir()
    report = convert(src, f"file://{empty}", format="webdataset", image=ImageOptions(size=8), workers=1)
    assert report.written == 18 and open_store(empty).meta.count == 18
    blob = tmp_path / "done.blob"
    convert(src, f"file://{blob}", image=ImageOptions(size=8), workers=1)
    with pytest.raises(OutputError, match="done.blob: already complete, nothing to resume; pass --overwrite instead of --resume"):
        convert(src, f"file://{blob}", image=ImageOptions(size=8), workers=1, resume=True)


@pytest.mark.parametrize("overwrite", [True, False])
def test_shards_of_another_name_in_the_folder_are_never_replaced(src, tmp_path, overwrite):
    """``out/val-%04d.tar`` into the folder of ``out/train-%04d.tar``: the folder is one dataset,
    and --overwrite deleted every train shard with it (a Streaming user's walkthrough). Refused
    with one line; the same pattern is still replaced."""
    convert(src, tmp_path / "out" / "train-%04d.tar", image=ImageOptions(size=8), workers=1)
    before = tree(tmp_path / "out")
    result = run("convert", src, tmp_path / "out" / "val-%04d.tar", "--size", "8", *(["--overwrite"] if overwrite else []))
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert (f"{tmp_path / 'out'}: holds a WebDataset of shards named train-%04d.tar, not val-%04d.tar; a folder holds one dataset"
            in result.stderr)
    assert f"for example {tmp_path / 'val' / 'val-%04d.tar'}" in result.stderr
    assert tree(tmp_path / "out") == before
    url = f"file://{tmp_path / 'out' / 'val-%04d.tar'}"  # through the URL path too (it deleted the train shards)
    with pytest.raises(OutputExistsError, match=r"holds a WebDataset of shards named train-%04d.tar, not val-%04d.tar"):
        convert(src, url, image=ImageOptions(size=8), workers=1, overwrite=overwrite)
    assert tree(tmp_path / "out") == before
    convert(src, tmp_path / "out" / "train-%04d.tar", image=ImageOptions(size=12), workers=1, overwrite=True)
    assert open_store(tmp_path / "out").meta.shape == (3, 12, 12)
    convert(src, tmp_path / "out", format="webdataset", image=ImageOptions(size=16), workers=1, overwrite=True)  # the folder itself: replaced
    assert open_store(tmp_path / "out").meta.shape == (3, 16, 16)
    convert(src, tmp_path / "val" / "val-%04d.tar", image=ImageOptions(size=8), workers=1)  # as the line says
    assert open_store(tmp_path / "val").meta.count == open_store(tmp_path / "out").meta.count


def test_shards_of_another_name_in_a_remote_folder_are_never_replaced(s3, src):
    convert(src, "s3://packer-test/splits/train-%04d.tar", image=ImageOptions(size=8), workers=1)
    before = sorted(s3.ls("packer-test/splits", detail=False))
    with pytest.raises(OutputExistsError, match=r"s3://packer-test/splits: holds a WebDataset of shards named train-%04d.tar, not val-%04d"):
        convert(src, "s3://packer-test/splits/val-%04d.tar", image=ImageOptions(size=8), workers=1, overwrite=True)
    s3.invalidate_cache()
    assert sorted(s3.ls("packer-test/splits", detail=False)) == before


def test_overwrite_of_a_shard_folder_needs_no_format(src, tmp_path):
    """A folder DST does not say its format; a finished packer dataset there does (an LLM user's
    walkthrough: --overwrite of the WebDataset folder just written said "cannot tell the format")."""
    convert(src, tmp_path / "d", format="webdataset", image=ImageOptions(size=8), workers=1)
    result = run("convert", src, tmp_path / "d", "--size", "12", "--overwrite")
    assert result.exit_code == 0, result.output
    assert open_store(tmp_path / "d").meta.format == "webdataset" and open_store(tmp_path / "d").meta.shape == (3, 12, 12)
    report = convert(src, f"file://{tmp_path / 'd'}", image=ImageOptions(size=16), workers=1, overwrite=True)  # as a file:// URL too
    assert report.written == 18 and open_store(tmp_path / "d").meta.shape == (3, 16, 16)
    result = run("convert", src, tmp_path / "new", "--size", "12")  # nothing there: the name must say
    assert result.exit_code == 2 and "cannot tell the format from the name" in result.output


@pytest.mark.parametrize("name, fmt", [("d.lmdb", "lmdb"), ("d.h5", "hdf5"), ("d", "webdataset")])
def test_a_dst_that_is_a_link_writes_its_target_and_keeps_the_link(src, tmp_path, name, fmt):
    """--overwrite of a link to a packer dataset replaced the link with a new folder beside it, the
    target (on the disk the link pointed at) left with the old samples (a data-safety walkthrough)."""
    from readers import open_dataset

    disk = tmp_path / "other-disk"
    disk.mkdir()
    target = disk / name
    convert(src, target, format=fmt, image=ImageOptions(size=8), workers=1)
    link = tmp_path / name
    link.symlink_to(target)
    report = convert(src, link, format=fmt, image=ImageOptions(size=4), workers=1, overwrite=True)
    assert link.is_symlink() and os.readlink(link) == str(target) and report.dst == link
    assert open_dataset(target)[0][0].shape == (3, 4, 4) and sorted(p.name for p in disk.iterdir()) == [name]
    empty = disk / "empty"
    empty.mkdir()
    (tmp_path / "e").symlink_to(empty)  # a link to an empty folder: a WebDataset written into it
    convert(src, tmp_path / "e", format="webdataset", image=ImageOptions(size=4), workers=1)
    assert (tmp_path / "e").is_symlink() and (empty / "packer.json").is_file()
    convert(src, tmp_path / "e" / "shard-%06d.tar", format="webdataset", image=ImageOptions(size=8), workers=1, overwrite=True)
    assert (tmp_path / "e").is_symlink() and open_dataset(empty)[0][0].shape == (3, 8, 8)  # a pattern in a linked folder (a review)


@pytest.mark.parametrize("case", ["published", "between renames", "made again empty", "holding other files", "running"])
def test_a_killed_overwrites_moved_aside_dataset_is_removed_or_put_back(src, tmp_path, case, caplog):
    """A SIGKILL inside publish() left the replaced dataset as DST.replaced-PID for good: a full
    copy nothing removed, or, killed between the two renames, the user's dataset moved aside with
    DST missing (an interrupted-conversions walkthrough). The next conversion to DST removes the
    copy once DST is published (there, no DST.partial), or puts it back where DST was (missing,
    or an empty folder made since: removing the copy there lost both datasets; a review), and
    leaves it, said, when DST holds other files or a conversion to DST runs."""
    from packer.files import recover_replaced
    from packer.locking import DestinationLock
    from readers.formats.inprogress import lock_path

    old, dst, partial = tmp_path / "old.lmdb", tmp_path / "out.lmdb", tmp_path / "out.lmdb.partial"
    convert(src, old, image=ImageOptions(size=8), workers=1)
    before = tree(old)
    if case == "published":
        convert(src, dst, image=ImageOptions(size=8), workers=1)
    aside = tmp_path / "out.lmdb.replaced-4242"
    os.replace(old, aside)
    if case != "published":  # the killed run's complete new output, not yet renamed
        convert(src, tmp_path / "new.lmdb", image=ImageOptions(size=8), workers=1)
        os.replace(tmp_path / "new.lmdb", partial)
    if case == "made again empty":
        dst.mkdir()
    if case == "holding other files":
        dst.mkdir()
        (dst / "notes.txt").write_text("mine")
    lock = DestinationLock(lock_path(partial), str(dst)).acquire() if case == "running" else None
    try:
        recover_replaced(dst)
    finally:
        if lock is not None:
            lock.release()
    if case == "published":
        assert not aside.exists() and "removed out.lmdb.replaced-4242" in caplog.text
    elif case in ("between renames", "made again empty"):
        assert not aside.exists() and tree(dst) == before and partial.exists() and "it is back" in caplog.text
    elif case == "holding other files":
        assert tree(aside) == before and (dst / "notes.txt").read_text() == "mine" and "so it is left there" in caplog.text
    else:
        assert tree(aside) == before and not caplog.text


def test_a_killed_overwrites_copy_is_removed_by_the_next_command(src, tmp_path):
    old, dst = tmp_path / "old.lmdb", tmp_path / "out.lmdb"
    convert(src, old, image=ImageOptions(size=8), workers=1)
    convert(src, dst, image=ImageOptions(size=8), workers=1)
    os.replace(old, tmp_path / "out.lmdb.replaced-4242")
    result = run("convert", src, dst, "--size", "8", "-j", "1", "--overwrite")
    assert result.exit_code == 0 and "removed out.lmdb.replaced-4242" in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.lmdb", "s"]
