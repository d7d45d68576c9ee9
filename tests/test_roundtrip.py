"""Convert -> read back, for every format: pixels, labels, shapes and metadata survive.

Samples are checked against what preprocessing makes of each input, read back both by the
format's plain library and by ``readers`` (tests/roundtrip_checks.py, whose checks
tests/test_mutations.py shows failing on a broken conversion).
"""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imagefiles import gradient, jpeg_bytes, png_bytes, write

from packer import ImageOptions, convert
from packer.preprocess.image import preprocess_image
from conftest import SUFFIX
from packer.writers import WRITERS
from readers.formats import open_store
from roundtrip_checks import check_images

FORMATS = sorted(WRITERS)


def convert_to(tmp_path: Path, src: Path, fmt: str, workers: int = 1, **image) -> Path:
    dst = tmp_path / f"out-{fmt}{SUFFIX[fmt]}"
    convert(src, dst, format=fmt, image=ImageOptions(**image), workers=workers)
    return dst


def expected(src: Path, options: ImageOptions) -> list[tuple[np.ndarray, int]]:
    """What preprocessing produces for every input, as (C, H, W) arrays, with its label. The
    inputs and labels come from the folder itself (sorted class folders, sorted files in each:
    the documented order), not from packer's scan, so a scan that mislabels is caught."""
    classes = sorted(d for d in src.iterdir() if d.is_dir())
    inputs = [(path, label) for label, folder in enumerate(classes) for path in sorted(folder.iterdir())]
    return [(preprocess_image(path.read_bytes(), options).transpose(2, 0, 1), label) for path, label in inputs]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("image", [dict(size=32), dict(size="24x40", resize_mode="pad", grayscale=True), dict(size=20, resize_mode="stretch")])
def test_raw_pixels_round_trip_exactly(tmp_path, image_folder, fmt, image):
    dst = convert_to(tmp_path, image_folder, fmt, **image)
    want = expected(image_folder, ImageOptions(**image))
    assert len({label for _, label in want}) == 3  # every class: a swapped label shows
    check_images(dst, want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_labels_classes_and_metadata_match_the_folder(tmp_path, image_folder, fmt):
    dst = convert_to(tmp_path, image_folder, fmt, size=16, grayscale=True)
    meta = open_store(dst).meta
    assert meta.format == fmt
    assert meta.classes == ("class_00", "class_01", "class_02")
    assert meta.count == 18 and meta.labeled
    assert meta.shape == (1, 16, 16) and meta.channels == 1
    assert meta.preprocessing["resize_mode"] == "center-crop" and meta.preprocessing["grayscale"] is True
    assert meta.tool_version and meta.created and meta.source == str(image_folder.resolve())
    assert meta.skipped == ()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_variable_shapes(tmp_path, fmt, encoding):
    src = tmp_path / "mixed"
    for name, (h, w) in {"a/wide.jpg": (40, 60), "a/tall.jpg": (60, 40), "b/square.png": (50, 50)}.items():
        write(src / name, jpeg_bytes(gradient(h, w)) if name.endswith("jpg") else png_bytes(Image.fromarray(gradient(h, w))))
    dst = convert_to(tmp_path, src, fmt, size=24, resize_mode="shorter", encoding=encoding)
    check_images(dst, expected(src, ImageOptions(size=24, resize_mode="shorter")))  # plain lmdb first: one open per process
    store = open_store(dst)
    assert store.meta.shape is None and not store.meta.fixed_shape
    samples = store.read_samples(range(3))
    assert [s[0].shape for s in samples] == [(3, 36, 24), (3, 24, 36), (3, 24, 24)]
    assert [s[1] for s in samples] == [0, 0, 1]
    with pytest.raises(ValueError, match="different shapes"):
        store.read_batch([0, 1])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("encoding", ["png", "jpeg"])
def test_encoded_samples_decode_back(tmp_path, image_folder, fmt, encoding):
    dst = convert_to(tmp_path, image_folder, fmt, size=32, encoding=encoding, **({"quality": 95} if encoding == "jpeg" else {}))
    assert open_store(dst).meta.encoding == encoding
    # png is lossless; jpeg at quality 95 within a mean error of 6 levels (PIL decodes the plain reads)
    check_images(dst, expected(image_folder, ImageOptions(size=32)), max_mean_error=0 if encoding == "png" else 6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_output_is_identical_whatever_the_worker_count(tmp_path, image_folder, fmt):
    one = open_store(convert_to(tmp_path / "one", image_folder, fmt, workers=1, size=16))
    two = open_store(convert_to(tmp_path / "two", image_folder, fmt, workers=2, size=16))
    a, la = one.read_batch(range(len(one)))
    b, lb = two.read_batch(range(len(two)))
    assert np.array_equal(a, b) and np.array_equal(la, lb)


@pytest.fixture(autouse=True)
def _mkdirs(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
