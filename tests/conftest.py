"""Shared fixtures: small generated image folders and conversions of them (nothing is shipped)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from packer import ImageOptions, convert
from packer.samples import make_image_folder

CLASSES = 3
PER_CLASS = 6
SOURCE_SIZE = (60, 80)  # height, width: small so tests stay fast


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 classes x 6 JPEGs of 80x60: class_00 .. class_02."""
    return make_image_folder(tmp_path_factory.mktemp("src") / "images", classes=CLASSES, per_class=PER_CLASS, size=SOURCE_SIZE)


@pytest.fixture(scope="session")
def lmdb_32(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``image_folder`` converted to LMDB at 32x32, raw, one worker."""
    dst = tmp_path_factory.mktemp("lmdb") / "data.lmdb"
    convert(image_folder, dst, image=ImageOptions(size=32), workers=1)
    return dst


#: Destination name suffix per format (webdataset: a folder of shards).
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "webdataset": ".shards", "blob": ".blob"}


@pytest.fixture(scope="session")
def packed_32(image_folder: Path, tmp_path_factory: pytest.TempPathFactory):
    """A function ``fmt -> path``: ``image_folder`` converted to ``fmt`` at 32x32 raw (cached)."""
    made: dict[str, Path] = {}

    def get(fmt: str) -> Path:
        if fmt not in made:
            dst = tmp_path_factory.mktemp(fmt) / f"data{SUFFIX[fmt]}"
            convert(image_folder, dst, format=fmt, image=ImageOptions(size=32), workers=1)
            made[fmt] = dst
        return made[fmt]

    return get


@pytest.fixture(scope="session")
def with_bad(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``image_folder`` plus two undecodable files (inputs 3 and 13 in scan order): later keys are renumbered."""
    src = tmp_path_factory.mktemp("bad") / "src"
    shutil.copytree(image_folder, src)
    (src / "class_00" / "000_bad.jpg").write_bytes(b"not an image")
    (src / "class_01" / "zzz_bad.jpg").write_bytes(b"not an image either")
    return src
