import os
from pathlib import Path

import pytest

from imagefiles import gradient, jpeg_bytes, write
from packer.errors import SourceError
from packer.sources.images import ImageFolder, scan_image_folder
from readers.schema import Skipped

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


def test_macos_metadata_folders_are_no_class(tmp_path):
    """A folder unzipped from macOS keeps __MACOSX (AppleDouble ._ files): it was class 0, empty,
    every real label one more than without it; beside a flat folder's images, it made the images
    'no images found in its class sub-folders' (a walkthrough)."""
    for name in ("a", "b"):
        write(tmp_path / "tree" / name / "0.jpg", JPEG)
    write(tmp_path / "tree" / "__MACOSX" / "a" / "._0.jpg", b"\x00\x05\x16\x07")
    assert scan_image_folder(tmp_path / "tree").classes == ["a", "b"]
    write(tmp_path / "flat" / "0.jpg", JPEG)
    write(tmp_path / "flat" / "__MACOSX" / "._0.jpg", b"\x00\x05\x16\x07")
    assert [os.path.basename(i.path) for i in scan_image_folder(tmp_path / "flat").items] == ["0.jpg"]


def test_images_beside_empty_sub_folders_are_named_in_the_error(tmp_path):
    write(tmp_path / "src" / "0.jpg", JPEG)
    write(tmp_path / "src" / "1.jpg", JPEG)
    (tmp_path / "src" / "thumbs").mkdir()
    with pytest.raises(SourceError, match=r"src: its folders \(thumbs\) hold no images, and with folders each is a "
                                          r"class, so its 2 images at the top level are in none: move the images into class"):
        scan_image_folder(tmp_path / "src")


def test_symlink_loops_are_cut(tmp_path):
    write(tmp_path / "cat/1.jpg", JPEG)
    os.symlink(tmp_path / "cat", tmp_path / "cat" / "loop")
    folder = scan_image_folder(tmp_path)
    assert len(folder.items) == 1
    assert any("symlink loop" in s.reason for s in folder.skipped)


def _symlinked_tree(root):
    """cat/ and dog/ with links in cat/: to ``..``, to the dog folder and to a dog image (they
    would give dog images the cat label: skipped), to a file and a folder inside cat/ and to a
    file outside SRC (followed)."""
    src = root / "src"
    write(src / "cat/1.jpg", JPEG)
    write(src / "cat/sub/2.jpg", gradient_jpeg(1))
    write(src / "dog/3.jpg", gradient_jpeg(2))
    write(root / "elsewhere/4.jpg", gradient_jpeg(3))
    write(root / "elsewhere/more/5.jpg", gradient_jpeg(4))
    os.symlink("..", src / "cat/up")
    os.symlink("../dog", src / "cat/dogs")
    os.symlink(src / "dog/3.jpg", src / "cat/dog3.jpg")
    os.symlink(root / "elsewhere/more", src / "cat/far_folder")
    os.symlink(root / "elsewhere/4.jpg", src / "cat/far.jpg")  # a link farm's file: followed
    os.symlink("1.jpg", src / "cat/again.jpg")  # a file inside cat/: followed
    os.symlink("sub", src / "cat/sub_link")  # a folder inside cat/: followed (the loop check keeps one copy)
    return src


def gradient_jpeg(seed: int) -> bytes:
    return jpeg_bytes(gradient(8, 8, seed=seed))


def test_symlinks_that_would_give_a_class_other_images_are_skipped_and_recorded(tmp_path):
    src = _symlinked_tree(tmp_path)
    folder = scan_image_folder(src)
    labels = {os.path.relpath(item.path, src): folder.classes[item.label] for item in folder.items}
    assert labels == {"cat/1.jpg": "cat", "cat/again.jpg": "cat", "cat/far.jpg": "cat", "cat/sub/2.jpg": "cat", "dog/3.jpg": "dog"}
    assert {(s.path, s.reason) for s in folder.skipped} == {
        ("cat/up", "symlink to '..' leads outside its class folder; not followed"),
        ("cat/dogs", "symlink to '../dog' leads outside its class folder; not followed"),
        ("cat/dog3.jpg", f"symlink to {str(src / 'dog/3.jpg')!r} leads outside its class folder; not followed"),
        ("cat/far_folder", f"symlink to {str(tmp_path / 'elsewhere/more')!r} leads outside its class folder; not followed"),
        ("cat/sub_link", "symlink loop (folder already visited)"),
    }


def test_what_is_written_has_the_labels_of_the_folders_it_is_really_in(tmp_path):
    from packer import ImageOptions, convert
    from readers.formats import open_store

    src = _symlinked_tree(tmp_path)
    report = convert(src, tmp_path / "out.lmdb", image=ImageOptions(size=8), workers=1)
    store = open_store(report.dst)
    assert store.meta.count == 5
    assert [store.read(i)[1] for i in range(5)] == [0, 0, 0, 0, 1]  # cat/1, again, far, sub/2; dog/3: no dog image as a cat
    assert {s.path for s in store.meta.skipped} == {"cat/up", "cat/dogs", "cat/dog3.jpg", "cat/far_folder", "cat/sub_link"}


def test_a_link_farm_converts(tmp_path):
    """Class folders of links to files elsewhere (packer bench's sample, git-annex, DVC): followed."""
    for i, name in enumerate(["cat", "dog"]):
        write(tmp_path / "store" / f"{i}.jpg", gradient_jpeg(i))
        (tmp_path / "src" / name).mkdir(parents=True)
        os.symlink(tmp_path / "store" / f"{i}.jpg", tmp_path / "src" / name / "x.jpg")
    write(tmp_path / "store/cats/1.jpg", JPEG)
    os.symlink(tmp_path / "store/cats", tmp_path / "src/lion")  # a class folder that is itself a link
    folder = scan_image_folder(tmp_path / "src")
    assert [(os.path.relpath(i.path, tmp_path / "src"), i.label) for i in folder.items] == [("cat/x.jpg", 0), ("dog/x.jpg", 1), ("lion/1.jpg", 2)]
    assert folder.skipped == []


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: None, "no such folder"),
        (lambda p: p.mkdir(), "is empty; SRC must be a folder of images"),
        (lambda p: (p.mkdir(), (p / "cat").mkdir()), "no images found in its class sub-folders"),
        (lambda p: p.write_bytes(JPEG), "is a file"),
    ],
)
def test_unusable_sources_are_clear_errors(tmp_path, setup, message):
    src = tmp_path / "src"
    setup(src)
    with pytest.raises(SourceError, match=message):
        scan_image_folder(src)


def _layout(root):
    for name in ["zebra/1.jpg", "apple/2.JPG", "apple/sub/3.jpeg", "apple/sub/10.png", "apple/.hid/4.jpg", "Mango/4.png",
                 "apple/notes.txt", "stray.jpg", ".ipynb_checkpoints/5.jpg", "zebra/.6.jpg"]:
        write(root / name, JPEG)
    (root / "empty_class").mkdir()


def _view(folder):
    return ([(folder.relative(i.path), i.label) for i in folder.items], folder.classes, folder.labeled, folder.skipped,
            folder.empty_classes)


def test_a_url_is_scanned_by_the_same_rules(tmp_path):
    """file:// goes through the fsspec lister (packer/sources/remote.py), as s3:// does."""
    _layout(tmp_path / "src")
    local = scan_image_folder(tmp_path / "src")
    remote = scan_image_folder(f"file://{tmp_path}/src/")
    assert _view(remote) == _view(local)
    assert _view(local)[0] == [("Mango/4.png", 0), ("apple/2.JPG", 1), ("apple/sub/10.png", 1), ("apple/sub/3.jpeg", 1), ("zebra/1.jpg", 3)]
    assert remote.items[0].path == f"file://{tmp_path}/src/Mango/4.png" and remote.source == f"file://{tmp_path}/src"
    assert all(remote.stamps[i.path].startswith(f"{len(JPEG)}:") for i in remote.items)  # size and version, for --resume
    assert local.stamps is None  # (local files are stat-ed instead)
    flat = tmp_path / "flat"
    for name in ["b.webp", "a.TIFF", "e.txt"]:
        write(flat / name, JPEG)
    assert _view(scan_image_folder(f"file://{flat}")) == _view(scan_image_folder(flat))


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: None, "no such folder"),
        (lambda p: p.mkdir(), "is empty; SRC must be a folder of images"),
        (lambda p: (p.mkdir(), (p / "cat").mkdir(), write(p / "cat" / "a.txt", b"")), "no images found in its class sub-folders"),
        (lambda p: p.write_bytes(JPEG), "is a file"),
    ],
)
def test_unusable_url_sources_are_the_same_clear_errors(tmp_path, setup, message):
    src = tmp_path / "src"
    setup(src)
    with pytest.raises(SourceError, match=f"^file://{src}: {message}"):
        scan_image_folder(f"file://{src}")


@pytest.mark.parametrize("root, path", [
    ("imgs", "imgs/a/b.jpg"), ("imgs/", "imgs/a/b.jpg"), (".", "a/b.jpg"), (".", "./a/b.jpg"), ("/", "/a/b.jpg"),
    ("/x/y", "/x/y/a b/c.jpg"), ("imgs", "imgs/../imgs/a.jpg"), ("imgs", "imgs/../other/a.jpg"), ("imgs", "other/a.jpg"),
    ("imgs", "imgs/./a.jpg"), ("imgs", "imgs//a.jpg"), ("imgs", "imgs/.."), ("imgs", "imgs/..a/b.jpg"), ("imgs", "imgs"),
])
def test_a_local_folders_names_are_what_relpath_says(root, path):
    """The names metadata records for a local SRC: the scan's own joins are cut by string, any
    other path goes through os.path.relpath; both must give relpath's answer."""
    folder = ImageFolder(root=Path(root), items=[], classes=(), labeled=False, skipped=[], empty_classes=[])
    assert folder.relative(path) == os.path.relpath(path, Path(root))


def test_an_empty_folder_and_a_packed_dataset_are_named_as_such(image_folder, tmp_path):
    """A newcomer's SRC mistakes: the empty folder was 'no images found at its top level', a
    packer LMDB 'no images found' too (a walkthrough)."""
    from packer import ImageOptions, convert

    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"empty: is empty; SRC must be a folder of images"):
        scan_image_folder(tmp_path / "empty")
    for name in ("t.lmdb", "t.blob"):
        convert(image_folder, tmp_path / name, image=ImageOptions(size=8), workers=1)
        fmt = name.split(".")[1]
        with pytest.raises(SourceError, match=rf"t.{fmt}: is a packer {fmt} dataset, not a source: convert the images it was made from"):
            scan_image_folder(tmp_path / name)
    # names alone are not a dataset: an image folder holding a .tar, a data.mdb or a packer.json of its own,
    # or named *.partial, is scanned as images (a review found them refused)
    import shutil

    mine = tmp_path / "mine.partial"
    shutil.copytree(image_folder, mine)
    for extra in ("backup.tar", "data.mdb", "packer.json"):
        (mine / extra).write_bytes(b"{}")
    assert len(scan_image_folder(mine).items) == 18
    (mine / "packer-index.npy").write_bytes(b"")  # a damaged packer index: np.load raised EOFError through the probe
    assert len(scan_image_folder(mine).items) == 18


def test_netpbm_images_convert_as_torchvisions_imagefolder_finds_them(tmp_path):
    """.ppm and .pgm are on ImageFolder's list of extensions and were left out without a word
    (an FFCV user's walkthrough): the pixels are Pillow's, a 16-bit PGM scaled to 8 bits."""
    import numpy as np
    from PIL import Image

    from packer import convert
    from readers import open_dataset

    rng = np.random.default_rng(0)
    color, gray = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8), rng.integers(0, 256, (6, 8), dtype=np.uint8)
    (tmp_path / "src/a").mkdir(parents=True)
    (tmp_path / "src/b").mkdir()
    Image.fromarray(color).save(tmp_path / "src/a/x.PPM", format="PPM")
    Image.fromarray(gray).save(tmp_path / "src/b/y.pgm")
    read = open_dataset(convert(tmp_path / "src", tmp_path / "o.blob", workers=1).dst)
    assert len(read) == 2 and read.classes == ["a", "b"]
    assert np.array_equal(read[0][0].numpy(), color.transpose(2, 0, 1)) and np.array_equal(read[1][0].numpy(), np.stack([gray] * 3))


def test_images_of_formats_not_converted_are_recorded_as_skipped(tmp_path):
    """A .jfif or .heic beside a class's .jpg files was left out without a word (torchvision's
    ImageFolder drops them too): each is a skip record saying what to do, in a local and a URL
    scan alike, never an input error that --on-error fail stops at; in a folder without classes too."""
    src = tmp_path / "src"
    for name in ["a/x.jpg", "a/sub/y.jfif", "a/z.HEIC", "a/.hidden.heic", "a/notes.txt", "b/w.png", "b/deep/v.avif"]:
        write(src / name, JPEG)
    local = scan_image_folder(src)
    assert [i.path for i in local.items] == [str(src / "a/x.jpg"), str(src / "b/w.png")]
    converted = ".bmp, .gif, .jpeg, .jpg, .pgm, .png, .ppm, .tif, .tiff, .webp"
    assert local.skipped == [
        Skipped("a/z.HEIC", f"a .heic image, not a format converted ({converted}): convert it to PNG or JPEG first"),
        Skipped("a/sub/y.jfif", f"a .jfif image, not a format converted ({converted}): a JPEG under another name: rename it .jpg"),
        Skipped("b/deep/v.avif", f"a .avif image, not a format converted ({converted}): convert it to PNG or JPEG first"),
    ]
    assert local.refused == [] and local.empty_classes == []
    assert _view(scan_image_folder(f"file://{src}/")) == _view(local)
    flat = tmp_path / "flat"
    for name in ["x.jpg", "y.jpe"]:
        write(flat / name, JPEG)
    assert [s.path for s in scan_image_folder(flat).skipped] == ["y.jpe"]


def test_an_empty_class_folder_names_the_files_it_holds_and_the_extensions_converted(tmp_path, caplog):
    """A class folder of .jfif and .avif files was 'has no images' with no word of why (torchvision
    lists its extensions; a newcomer walkthrough)."""
    from PIL import Image

    from packer import ImageOptions, convert

    for cls in ("a", "b"):
        (tmp_path / "src" / cls).mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "src" / "a" / "x.jpg")
    Image.new("RGB", (8, 8)).save(tmp_path / "src" / "b" / "x.jfif", "JPEG")
    (tmp_path / "src" / "b" / "y.avif").write_bytes(b"")
    convert(tmp_path / "src", tmp_path / "o.blob", image=ImageOptions(size=8), workers=1)
    assert ("class folder 'b' has no images (its label is kept); its 2 files (e.g. b/x.jfif) are not of the extensions "
            "converted: .bmp, .gif, .jpeg, .jpg") in caplog.text
