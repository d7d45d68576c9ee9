"""Files of the user's named like what a conversion leaves beside DST (``DST.partial``, its
``-journal`` folder, its ``-lock`` file) are never removed or rewritten: a fresh run, --resume
and --overwrite refuse in one line naming them, and every file stays as it was. packer's own
leftovers are still cleared (tests/test_overwrite.py, tests/test_resume.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.cli import cli


def tree(root: Path) -> dict[str, str]:
    return {os.path.relpath(os.path.join(d, f), root): hashlib.sha256(Path(d, f).read_bytes()).hexdigest()
            for d, _, files in os.walk(root) for f in files}


def folder_of_mine(path: Path) -> None:
    path.mkdir()
    (path / "thesis").mkdir()
    (path / "thesis" / "ch1.tex").write_text("draft")


def file_of_mine(path: Path) -> None:
    path.write_text("my notes")


def journal_of_mine(path: Path) -> None:
    path.mkdir()
    (path / "results.csv").write_text("a,b\n")


LEFTOVERS = {  # (name beside DST, how the user made it, what the error names)
    "partial folder": (".partial", folder_of_mine, "no journal beside it"),
    "partial file": (".partial", file_of_mine, "no journal beside it"),
    "journal folder": (".partial-journal", journal_of_mine, "'results.csv', which packer's journal never does"),
    "lock file": (".partial-lock", file_of_mine, "holds something other than packer's lock"),
    "lock file of digits": (".partial-lock", lambda path: path.write_text("2024\n"), "holds something other than packer's lock"),
}


@pytest.mark.parametrize("kind", LEFTOVERS)
@pytest.mark.parametrize("name, fmt", [("d.lmdb", "lmdb"), ("d.h5", "hdf5"), ("d.blob", "blob"), ("d", "webdataset")])
@pytest.mark.parametrize("extra", [[], ["--resume"], ["--overwrite"]])
def test_a_users_file_named_like_a_leftover_is_refused_and_kept(image_folder, tmp_path, kind, name, fmt, extra):
    """They were removed without a word (the lock file truncated to a pid) by a fresh run, and by
    --resume with nothing to resume (a data-safety walkthrough)."""
    out = tmp_path / "out"
    out.mkdir()
    suffix, make, named = LEFTOVERS[kind]
    make(out / (name + suffix))
    before = tree(out)
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(out / name), "-f", fmt, "--size", "8", "-q", *extra])
    assert result.exit_code != 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and named in lines[0] and "move it away" in lines[0], result.output
    assert tree(out) == before and sorted(p.name for p in out.iterdir()) == [name + suffix]


def empty_journal(path: Path) -> None:
    path.mkdir()


def journal_record_of_mine(path: Path) -> None:
    path.mkdir()
    for name, text in (("journal.json", "x"), ("samples.i64", ""), ("names.jsonl", "")):
        (path / name).write_text(text)


@pytest.mark.parametrize("journal, named", [(empty_journal, "lacks the samples.i64 and names.jsonl every journal of packer's begins with"),
                                            (journal_record_of_mine, "journal.json is not a journal packer wrote")])
@pytest.mark.parametrize("name, fmt", [("d.lmdb", "lmdb"), ("d", "webdataset")])
@pytest.mark.parametrize("extra", [[], ["--resume"], ["--overwrite"]])
def test_a_journal_folder_of_no_journal_does_not_make_the_partial_folder_packers(image_folder, tmp_path, journal, named, name, fmt, extra):
    """An empty DST.partial-journal folder, or one whose journal.json is no journal, made the
    user's own DST.partial folder packer's leftover: removed without a word (a data-safety walkthrough)."""
    out = tmp_path / "out"
    out.mkdir()
    folder_of_mine(out / (name + ".partial"))
    journal(out / (name + ".partial-journal"))
    before = tree(out)
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(out / name), "-f", fmt, "--size", "8", "-q", *extra])
    assert result.exit_code != 0 and named in result.output and "move it away" in result.output, result.output
    assert tree(out) == before and sorted(p.name for p in out.iterdir()) == [name + ".partial", name + ".partial-journal"]


@pytest.mark.parametrize("name, fmt, overwrite", [("d.lmdb", "lmdb", False), ("d", "webdataset", False), ("d.blob", "blob", True), ("d.h5", "hdf5", True)])
def test_the_users_permissions_on_dst_are_kept(image_folder, tmp_path, name, fmt, overwrite):
    """An empty private folder taken as DST, or a private file replaced with --overwrite, came
    back readable by everyone (755/644: a data-safety walkthrough)."""
    from packer import ImageOptions, convert

    dst = tmp_path / name
    if overwrite:
        convert(image_folder, dst, format=fmt, image=ImageOptions(size=8), workers=1)
        dst.chmod(0o600)
    else:
        dst.mkdir(mode=0o700)
        dst.chmod(0o700)
    convert(image_folder, dst, format=fmt, image=ImageOptions(size=8), workers=1, overwrite=overwrite)
    assert oct(dst.stat().st_mode & 0o777) == oct(0o600 if overwrite else 0o700)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing left beside it


def test_an_empty_or_zeroed_lock_file_is_a_stale_lock_taken_over(image_folder, tmp_path):
    """A crash can leave the lock file empty, or zeros where its write never reached the disk:
    packer's, taken over (a review saw zeros refused as the user's)."""
    from packer import ImageOptions, convert

    for content in (b"", b"\0\0\0\0\n"):
        (tmp_path / "d.lmdb.partial-lock").write_bytes(content)
        assert convert(image_folder, tmp_path / "d.lmdb", image=ImageOptions(size=8), workers=1, overwrite=True).written == 18
        assert sorted(p.name for p in tmp_path.iterdir()) == ["d.lmdb"]


def test_a_dst_of_another_kind_gives_sensible_permissions(image_folder, tmp_path):
    """A file output where the user's empty 700 folder was: 600, not an executable 700 file;
    a folder output replacing a 644 file: 755, enterable (a review)."""
    from packer import ImageOptions, convert

    (tmp_path / "out.blob").mkdir(mode=0o700)
    (tmp_path / "out.blob").chmod(0o700)
    convert(image_folder, tmp_path / "out.blob", image=ImageOptions(size=8), workers=1)
    assert oct((tmp_path / "out.blob").stat().st_mode & 0o777) == oct(0o600)
    convert(image_folder, tmp_path / "x.data", format="blob", image=ImageOptions(size=8), workers=1)
    (tmp_path / "x.data").chmod(0o644)
    convert(image_folder, tmp_path / "x.data", format="lmdb", image=ImageOptions(size=8), workers=1, overwrite=True)
    assert oct((tmp_path / "x.data").stat().st_mode & 0o777) == oct(0o755)


def test_a_failed_rename_puts_the_replaced_dataset_back(image_folder, tmp_path, monkeypatch):
    """Between moving the old DST aside and the new one in, a failure left DST missing and the
    old dataset under another name (a review)."""
    import packer.files as files
    from packer import ImageOptions, convert
    from packer.errors import OutputError
    from readers.formats import open_store

    dst = tmp_path / "d.blob"
    convert(image_folder, dst, image=ImageOptions(size=8), workers=1)
    before = dst.read_bytes()
    real = os.replace

    def failing(src, target):
        if str(src).endswith(".partial"):
            raise OSError(5, "Input/output error")
        return real(src, target)

    monkeypatch.setattr(files.os, "replace", failing)
    with pytest.raises(OutputError):
        convert(image_folder, dst, image=ImageOptions(size=16), workers=1, overwrite=True)
    monkeypatch.undo()
    assert dst.read_bytes() == before and open_store(dst).meta.count == 18
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.blob"]


def test_an_older_packers_lock_beside_its_journal_is_taken_over(image_folder, tmp_path):
    """A run killed under an older packer left its bare pid in the lock file: with its journal
    beside it, it is packer's and a rerun goes on (a review saw --resume refused)."""
    from packer import ImageOptions, convert

    (tmp_path / "d.lmdb.partial-lock").write_text("999999\n")
    (tmp_path / "d.lmdb.partial-journal").mkdir()  # (empty: killed between its mkdir and its files, nothing else to lose)
    assert convert(image_folder, tmp_path / "d.lmdb", image=ImageOptions(size=8), workers=1).written == 18
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.lmdb"]
