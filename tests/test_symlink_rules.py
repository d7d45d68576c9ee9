"""Symlinks in a class folder (README, *Bad input*; docs/RELIABILITY.md, *Odd source trees*): a
link that would give a class folder other images is refused and recorded, or stops the run with
``--on-error fail``; class folders that are themselves links are judged at their real paths, so
no image is stored under two labels."""

import os

import pytest
from click.testing import CliRunner

from imagefiles import gradient, jpeg_bytes, write
from packer import ImageOptions, convert
from packer.cli import cli
from packer.errors import InputError
from packer.sources.images import scan_image_folder

REFUSED = "leads outside its class folder; not followed"


def jpeg(seed: int) -> bytes:
    return jpeg_bytes(gradient(8, 8, seed=seed))


def repro_tree(root):
    """The tester's repro: a/ with images, b/ with only a link to one of them."""
    for i in range(3):
        write(root / "a" / f"{i}.jpg", jpeg(i))
    (root / "b").mkdir()
    os.symlink("../a/1.jpg", root / "b/l.jpg")
    return root


def labels_of(folder, src):
    return {os.path.relpath(item.path, src): folder.classes[item.label] for item in folder.items}


def test_on_error_fail_stops_at_a_refused_symlink(tmp_path):
    src = repro_tree(tmp_path / "sl")
    os.symlink(".", src / "a/loop")  # a symlink loop (recorded, not an error) is met first: the message still names the link
    write(src / "stray.jpg", jpeg(9))  # an image outside any class folder: recorded, not an error
    result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "f.lmdb"), "--size", "8", "--on-error", "fail", "-j", "1", "-q"])
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: b/l.jpg: symlink to '../a/1.jpg' {REFUSED} (pass --on-error skip to skip such inputs)")
    assert not (tmp_path / "f.lmdb").exists() and not (tmp_path / "f.lmdb.partial").exists()
    with pytest.raises(InputError, match="b/l.jpg: symlink"):
        convert(src, tmp_path / "g.lmdb", image=ImageOptions(size=8), workers=1, on_error="fail")
    report = convert(src, tmp_path / "s.lmdb", image=ImageOptions(size=8), workers=1)  # skip: converted, recorded
    assert report.written == 3
    assert [s.path for s in report.skipped][0] == "b/l.jpg"  # refusals first, then the rest in scan order
    assert {s.path for s in report.skipped} == {"b/l.jpg", "a/loop", "stray.jpg"}


def test_skips_that_are_the_labelling_rules_do_not_stop_on_error_fail(tmp_path):
    """An image outside any class folder, a symlink loop, a link farm's file: converted as ever."""
    src = tmp_path / "src"
    write(src / "a/1.jpg", jpeg(1))
    write(src / "stray.jpg", jpeg(2))
    write(tmp_path / "store/3.jpg", jpeg(3))
    os.symlink(tmp_path / "store/3.jpg", src / "a/farm.jpg")
    os.symlink(".", src / "a/loop")
    report = convert(src, tmp_path / "ok.lmdb", image=ImageOptions(size=8), workers=1, on_error="fail")
    assert report.written == 2 and {s.path for s in report.skipped} == {"stray.jpg", "a/loop"}


def test_symlinked_class_folders_keep_each_image_under_one_label(tmp_path):
    """``sl4/cats -> ../mixed/cats``: the link in dogs/ to a cat image is refused, as it is when
    mixed/ itself is converted (it was followed: the same image under both labels)."""
    mixed = tmp_path / "mixed"
    write(mixed / "cats/1.jpg", jpeg(1))
    write(mixed / "cats/2.jpg", jpeg(2))
    write(mixed / "dogs/d.jpg", jpeg(3))
    os.symlink("../cats/1.jpg", mixed / "dogs/l.jpg")
    src = tmp_path / "sl4"
    src.mkdir()
    os.symlink("../mixed/cats", src / "cats")
    os.symlink("../mixed/dogs", src / "dogs")
    for root in (mixed, src):
        folder = scan_image_folder(root)
        assert labels_of(folder, root) == {"cats/1.jpg": "cats", "cats/2.jpg": "cats", "dogs/d.jpg": "dogs"}, root
        assert [(s.path, s.reason) for s in folder.skipped] == [("dogs/l.jpg", f"symlink to '../cats/1.jpg' {REFUSED}")]
        assert folder.refused == folder.skipped


def test_a_link_from_a_plain_class_folder_into_a_linked_one_is_refused(tmp_path):
    """An absolute link in dogs/ to an image of cats/, whose real folder is outside SRC: it is
    another class's image, not a link farm's file."""
    write(tmp_path / "store/cats/1.jpg", jpeg(1))
    write(tmp_path / "store/cats/sub/2.jpg", jpeg(2))
    write(tmp_path / "elsewhere/3.jpg", jpeg(3))
    src = tmp_path / "src"
    write(src / "dogs/d.jpg", jpeg(4))
    os.symlink(tmp_path / "store/cats", src / "cats")
    os.symlink(tmp_path / "store/cats/1.jpg", src / "dogs/cat.jpg")
    os.symlink(tmp_path / "store/cats/sub", src / "dogs/catsub")
    os.symlink(tmp_path / "elsewhere/3.jpg", src / "dogs/farm.jpg")  # a file outside SRC and its class folders: followed
    os.symlink("../../src/cats/1.jpg", src / "cats/sub/again.jpg")  # into its own class folder, through its link: followed
    folder = scan_image_folder(src)
    assert labels_of(folder, src) == {"cats/1.jpg": "cats", "cats/sub/2.jpg": "cats", "cats/sub/again.jpg": "cats",
                                      "dogs/d.jpg": "dogs", "dogs/farm.jpg": "dogs"}
    assert {s.path for s in folder.refused} == {"dogs/cat.jpg", "dogs/catsub"}


def test_class_folders_that_are_one_folder_or_nested_give_each_image_one_label(tmp_path):
    store = tmp_path / "store"
    write(store / "cats/1.jpg", jpeg(1))
    write(store / "cats/kittens/2.jpg", jpeg(2))
    src = tmp_path / "src"
    write(src / "dogs/3.jpg", jpeg(3))
    os.symlink(store / "cats", src / "cats")
    os.symlink(store / "cats/kittens", src / "kittens")  # inside cats' real folder: its images are kittens'
    os.symlink("dogs", src / "a_hounds")  # the same folder as dogs/ (sorted first; the plain folder keeps them)
    folder = scan_image_folder(src)
    assert labels_of(folder, src) == {"cats/1.jpg": "cats", "kittens/2.jpg": "kittens", "dogs/3.jpg": "dogs"}
    assert {(s.path, s.reason) for s in folder.refused} == {
        ("cats/kittens", "is the class folder 'kittens' (through a symlink); its images are under that label"),
        ("a_hounds", "is the same folder as the class folder 'dogs' (through a symlink); its images are under that label"),
    }
    assert folder.empty_classes == ["a_hounds"]


def test_a_broken_link_at_the_top_is_recorded_and_fails_on_error_fail(tmp_path):
    """A class folder linked from an unmounted disk dropped its class without a word (labels after
    it shifted), and a broken link or FIFO named like an image in a flat folder was left out, even
    with --on-error fail (a walkthrough)."""
    src = tmp_path / "classes"
    for name in ("a", "c"):
        write(src / name / "0.jpg", jpeg(len(name)))
    os.symlink("/nonexistent/b", src / "b")
    report = convert(src, tmp_path / "s.lmdb", image=ImageOptions(size=8), workers=1)
    assert report.written == 2 and [(s.path, s.reason[:40]) for s in report.skipped] == [
        ("b", "a symlink to '/nonexistent/b', which lea")]
    with pytest.raises(InputError, match=r"^b: a symlink to '/nonexistent/b', which leads nowhere"):
        convert(src, tmp_path / "f.lmdb", image=ImageOptions(size=8), workers=1, on_error="fail")

    flat = tmp_path / "flat"
    write(flat / "1.jpg", jpeg(1))
    os.symlink("missing.jpg", flat / "2.jpg")
    os.mkfifo(flat / "3.jpg")
    folder = scan_image_folder(flat)
    assert [os.path.basename(item.path) for item in folder.items] == ["1.jpg", "2.jpg", "3.jpg"]  # (each worker records its own)
    report = convert(flat, tmp_path / "flat.blob", image=ImageOptions(size=8), workers=1)
    assert report.written == 1 and [(s.path, s.reason) for s in report.skipped] == [
        ("2.jpg", "cannot read (No such file or directory)"), ("3.jpg", "not a regular file")]


def test_a_broken_link_named_as_a_file_is_no_class(tmp_path):
    """An editor's lock (.#notes.txt -> user@host.1234) or a README.md link leading nowhere is no
    class folder: --on-error fail stopped a valid conversion at it (a review)."""
    src = tmp_path / "flat"
    write(src / "1.jpg", jpeg(1))
    os.symlink("user@host.1234:1700000000", src / ".#notes.txt")
    os.symlink("../README.md", src / "README.md")
    report = convert(src, tmp_path / "f.lmdb", image=ImageOptions(size=8), workers=1, on_error="fail")
    assert report.written == 1 and report.skipped == []
