import os

import pytest

from imagefiles import gradient, jpeg_bytes, write
from packer.errors import SourceError
from packer.sources.images import scan_image_folder

JPEG = jpeg_bytes(gradient(8, 8))


def test_class_folders_give_sorted_labels(tmp_path):
    for name in ["zebra/1.jpg", "apple/2.JPG", "apple/sub/3.jpeg", "Mango/4.png", "apple/notes.txt"]:
        write(tmp_path / name, JPEG)
    folder = scan_image_folder(tmp_path)
    assert folder.labeled
    assert folder.classes == ["Mango", "apple", "zebra"]  # plain sorted order, as torchvision's ImageFolder
    labels = {os.path.relpath(item.path, tmp_path): item.label for item in folder.items}
    assert labels == {"Mango/4.png": 0, "apple/2.JPG": 1, "apple/sub/3.jpeg": 1, "zebra/1.jpg": 2}


def test_order_is_deterministic_by_class_then_path(tmp_path):
    for name in ["b/2.jpg", "b/10.jpg", "a/z/1.jpg", "a/y.jpg"]:
        write(tmp_path / name, JPEG)
    paths = [os.path.relpath(i.path, tmp_path) for i in scan_image_folder(tmp_path).items]
    assert paths == ["a/y.jpg", "a/z/1.jpg", "b/10.jpg", "b/2.jpg"]


def test_flat_folder_is_unlabeled(tmp_path):
    for name in ["b.webp", "a.TIFF", "c.gif", "d.bmp", "e.txt"]:
        write(tmp_path / name, JPEG)
    folder = scan_image_folder(tmp_path)
    assert not folder.labeled and folder.classes == []
    assert [os.path.basename(i.path) for i in folder.items] == ["a.TIFF", "b.webp", "c.gif", "d.bmp"]
    assert all(i.label == -1 for i in folder.items)


def test_hidden_entries_are_ignored_and_stray_images_recorded(tmp_path):
    write(tmp_path / "cat/1.jpg", JPEG)
    write(tmp_path / ".ipynb_checkpoints/2.jpg", JPEG)
    write(tmp_path / "cat/.3.jpg", JPEG)
    write(tmp_path / "stray.jpg", JPEG)
    (tmp_path / "empty_class").mkdir()
    folder = scan_image_folder(tmp_path)
    assert folder.classes == ["cat", "empty_class"]
    assert len(folder.items) == 1
    assert [(s.path, "outside any class folder" in s.reason) for s in folder.skipped] == [("stray.jpg", True)]
    assert folder.empty_classes == ["empty_class"]


def test_symlink_loops_are_cut(tmp_path):
    write(tmp_path / "cat/1.jpg", JPEG)
    os.symlink(tmp_path / "cat", tmp_path / "cat" / "loop")
    folder = scan_image_folder(tmp_path)
    assert len(folder.items) == 1
    assert any("symlink loop" in s.reason for s in folder.skipped)


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: None, "no such folder"),
        (lambda p: p.mkdir(), "no images found at its top level"),
        (lambda p: (p.mkdir(), (p / "cat").mkdir()), "no images found in its class sub-folders"),
        (lambda p: p.write_bytes(JPEG), "is a file"),
    ],
)
def test_unusable_sources_are_clear_errors(tmp_path, setup, message):
    src = tmp_path / "src"
    setup(src)
    with pytest.raises(SourceError, match=message):
        scan_image_folder(src)
