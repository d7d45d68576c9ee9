"""An archive keeps the class folders of the folder it unpacks to: an empty class folder, or one
holding no image (only a text file, only a hidden file), is a class as in the folder, so the
labels of the other classes do not shift. Archives are written with plain tarfile / zipfile:
a tar (``./`` names, as ``tar cf x.tar -C src .``), a .tar.gz, a zip with directory entries
(as ``zip -r``), a tar wrapping one top folder (looked through); a zip written without
directory entries cannot hold an empty folder, and says so by its classes."""

from __future__ import annotations

import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from imagefiles import gradient, jpeg_bytes, write
from packer.errors import SourceError
from packer.sources.archives import scan_archive
from packer.sources.images import scan_image_folder
from test_labels import lmdb_samples, run

#: The class folders: a (two images, one nested), b (empty), c (one image), d (only a text
#: file), e (only a hidden file), f (one image); the folder's labels are a=0, c=2, f=5.
CLASSES = ["a", "b", "c", "d", "e", "f"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("empty_classes") / "src"
    for i, name in enumerate(["a/1.jpg", "a/sub/2.jpg", "c/3.jpg", "f/4.jpg", ".cache/5.jpg"]):
        write(root / name, jpeg_bytes(gradient(24, 32, seed=i)))
    (root / "b").mkdir()
    write(root / "d/notes.txt", b"not an image")
    write(root / "e/.DS_Store", b"\0\0\0\1Bud1")
    write(root / "readme.txt", b"next to the classes")
    return root


@pytest.fixture(scope="module")
def reference(source: Path, tmp_path_factory: pytest.TempPathFactory):
    dst = tmp_path_factory.mktemp("ref") / "folder.lmdb"
    result = run(source, dst)
    assert result.exit_code == 0, result.output
    return lmdb_samples(dst)


def _tree(source: Path) -> list[tuple[str, Path]]:
    """``(relative path, path)`` of every folder and file below ``source``, hidden ones included."""
    found = []
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames.sort()
        for name in sorted(dirnames) + sorted(filenames):
            path = Path(dirpath) / name
            found.append((path.relative_to(source).as_posix(), path))
    return found


def make_archive(source: Path, where: Path, kind: str) -> Path:
    if kind == "tar":  # tar cf x.tar -C src .
        path = where / "src.tar"
        with tarfile.open(path, "w") as tar:
            tar.add(source, arcname=".")
    elif kind == "tar.gz":
        path = where / "src.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            for name, file in _tree(source):
                tar.add(file, arcname=name, recursive=False)
    elif kind == "wrapped tar":  # tar cf train.tar train/: one top folder, looked through
        path = where / "train.tar"
        with tarfile.open(path, "w") as tar:
            tar.add(source, arcname="train")
    else:  # zip -r (directory entries), or zipfile.writestr of the files alone
        path = where / f"{kind.replace(' ', '-')}.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, file in _tree(source):
                if file.is_file():
                    zf.writestr(name, file.read_bytes())
                elif kind == "zip":
                    zf.write(file, name)  # a directory entry, "name/"
    return path


def labels_of(samples: dict[bytes, bytes]) -> list[int]:
    return [int.from_bytes(samples[key][:4], "little", signed=True) for key in sorted(samples)]


def test_the_folder_keeps_its_empty_class_folders(reference):
    samples, meta = reference
    assert meta["classes"] == CLASSES
    assert labels_of(samples) == [0, 0, 2, 5]


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "zip", "wrapped tar"])
def test_an_archive_keeps_the_folders_empty_classes_and_labels(source, reference, tmp_path, kind):
    archive = make_archive(source, tmp_path, kind)
    folder = scan_archive(archive, None)
    assert folder.classes == CLASSES and folder.empty_classes == ["b", "d", "e"]
    dst = tmp_path / "archive.lmdb"
    result = run(archive, dst)
    assert result.exit_code == 0, result.output
    samples, meta = lmdb_samples(dst)
    assert meta["classes"] == reference[1]["classes"] == CLASSES
    assert labels_of(samples) == labels_of(reference[0])
    assert samples == reference[0]  # labels, pixels and order: byte for byte
    assert meta["skipped"] == reference[1]["skipped"] == []


def test_an_archive_lists_the_folders_classes_and_items(source, tmp_path):
    """The scan itself: classes, empty classes and each sample's relative path and label."""
    expected = scan_image_folder(source)
    want = [(expected.relative(item.path).replace(os.sep, "/"), item.label) for item in expected.items]
    for kind in ("tar", "tar.gz", "zip", "wrapped tar"):
        folder = scan_archive(make_archive(source, tmp_path, kind), None)
        prefix = "train/" if kind == "wrapped tar" else ""
        assert (folder.classes, folder.empty_classes) == (expected.classes, expected.empty_classes), kind
        assert [(item.name, item.label) for item in folder.items] == [(prefix + name, label) for name, label in want], kind


def test_a_zip_without_directory_entries_has_no_empty_folder(source, tmp_path):
    """Only a folder the archive records, or that holds a member (a text file, a hidden file),
    is there: an empty folder with no directory entry is not."""
    folder = scan_archive(make_archive(source, tmp_path, "zip without folders"), None)
    assert folder.classes == ["a", "c", "d", "e", "f"] and folder.empty_classes == ["d", "e"]
    assert [item.label for item in folder.items] == [0, 0, 1, 4]


def test_folders_decide_the_layout_as_in_the_folder(tmp_path):
    """Images next to an empty folder are outside any class (the folder's error, in one line);
    a second top folder, even empty, stops a wrapping folder being looked through."""
    image = jpeg_bytes(gradient(24, 32))
    flat = tmp_path / "flat"
    write(flat / "1.jpg", image)
    (flat / "empty").mkdir()
    said = r": its folders \(empty\) hold no images, and with folders each is a class, so its image at the top level is in none"
    with pytest.raises(SourceError, match=said):
        scan_image_folder(flat)
    with tarfile.open(tmp_path / "flat.tar", "w") as tar:
        tar.add(flat, arcname=".")
    with pytest.raises(SourceError, match=said):
        scan_archive(tmp_path / "flat.tar", None)
    with tarfile.open(tmp_path / "two.tar", "w") as tar:
        tar.addfile(tarfile.TarInfo("train/a/1.jpg"))
        info = tarfile.TarInfo("extra")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    folder = scan_archive(tmp_path / "two.tar", None)
    assert folder.classes == ["extra", "train"] and folder.empty_classes == ["extra"]
    assert [(item.name, item.label) for item in folder.items] == [("train/a/1.jpg", 1)]


def test_tar_listings_give_tarfiles_directory_entries(source, tmp_path):
    """Both tar listings (by offset, and the streaming pass over a .tar.gz) give every member
    tarfile reads, folders marked and never holding bytes."""
    from packer.sources.tarstream import list_tar, stream_tar

    plain, packed = make_archive(source, tmp_path, "tar"), make_archive(source, tmp_path, "tar.gz")
    listings = {plain: list_tar(str(plain)), packed: stream_tar(str(packed), lambda name: True, lambda held: None)}
    for path, listing in listings.items():
        with tarfile.open(path) as tar:
            expected = [(info.name, info.isdir()) for info in tar]
        assert any(folder for _, folder in expected)
        assert [(entry.name.rstrip("/"), entry.folder) for entry in listing] == expected, path.name
        assert all(entry.size == 0 and entry.data is None for entry in listing if entry.folder)


def test_unsafe_folder_entries_are_not_recorded_as_inputs(tmp_path):
    """A directory entry holds nothing: one with an absolute or '..' path is passed over, not
    recorded as a refused input (its members, if any, are refused one by one)."""
    image = tmp_path / "1.jpg"
    write(image, jpeg_bytes(gradient(8, 8, seed=1)))
    path = tmp_path / "odd.tar"
    with tarfile.open(path, "w") as archive:
        for name in ("/abs/", "/abs/x/", "../up/"):
            info = tarfile.TarInfo(name.rstrip("/"))
            info.type = tarfile.DIRTYPE
            archive.addfile(info)
        archive.add(image, "cat/1.jpg")
        archive.add(image, "dog/2.jpg")
    folder = scan_archive(path, None, 1)
    assert folder.classes == ["cat", "dog"] and folder.skipped == []
