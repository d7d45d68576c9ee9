"""The standard evaluation crop (``--size 224 --resize 256``: torchvision's ``Resize(256)`` +
``CenterCrop(224)``) against PIL itself, the old default unchanged, its refusals, and its
metadata reproduced by ``packer verify --source``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import lmdb
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer.cli import cli
from packer.errors import OptionError
from packer.options import ImageOptions
from packer.preprocess.geometry import plan_for
from packer.preprocess.image import preprocess_image
from packer.samples import make_image_folder, natural_image

#: Mean |difference| (0-255 scale) allowed between packer's standard crop and PIL's: the same
#: geometry, different antialiasing filters (OpenCV area vs PIL's bilinear support) and, for large
#: JPEGs, the reduced DCT decode. Measured 0.0-2.0 on these images; the old default crop (a 1.14x
#: wider view) is 23-30 away from the same reference.
BOUND = 2.5
SHAPES = [(375, 500), (500, 375), (333, 500), (260, 300), (1200, 1600), (256, 256)]


def jpeg(height: int, width: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(natural_image(np.random.default_rng(seed), height, width, seed % 10)).save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


def pil_reference(data: bytes, shorter: int, crop: int) -> np.ndarray:
    """Resize(shorter) + CenterCrop(crop) the way torchvision does it on a PIL image, written here
    against PIL directly (not packer's helper): int() of the long side, bilinear (PIL antialiases),
    crop offsets round((side - crop) / 2)."""
    with Image.open(io.BytesIO(data)) as image:
        image = image.convert("RGB")
        w, h = image.size
        size = (shorter, int(shorter * h / w)) if w <= h else (int(shorter * w / h), shorter)
        image = image.resize(size, Image.BILINEAR)
        top, left = int(round((size[1] - crop) / 2.0)), int(round((size[0] - crop) / 2.0))
        return np.asarray(image.crop((left, top, left + crop, top + crop)), dtype=np.int16)


@pytest.mark.parametrize("shape", SHAPES)
def test_standard_crop_matches_pil_resize_256_center_crop_224(shape: tuple[int, int]) -> None:
    data = jpeg(*shape, seed=shape[0])
    reference = pil_reference(data, 256, 224)
    mine = preprocess_image(data, ImageOptions(size=224, resize=256)).astype(np.int16)
    assert mine.shape == (224, 224, 3)
    diff = float(np.abs(mine - reference).mean())
    assert diff < BOUND, (shape, diff)
    wider = float(np.abs(preprocess_image(data, ImageOptions(size=224)).astype(np.int16) - reference).mean())
    assert wider > 5 * BOUND, (shape, wider)  # the default is another view: the test can tell them apart


def test_non_square_standard_crop_keeps_torchvision_offsets() -> None:
    plan = plan_for("center-crop", 375, 500, (160, 224), 256)
    assert plan.crop == (0, 0, 375, 500) and plan.resize == (256, 341)
    assert plan.recrop == (48, 58, 160, 224) and plan.output == (160, 224)  # round(96/2), round(117/2) (half to even)


def test_default_crop_unchanged() -> None:
    """Without --resize: the shorter side to the size, a centre crop of whole source pixels, and
    the metadata record as before (no resize key)."""
    assert plan_for("center-crop", 375, 500, (224, 224)) == plan_for("center-crop", 375, 500, (224, 224), None)
    plan = plan_for("center-crop", 375, 500, (224, 224))
    assert (plan.crop, plan.resize, plan.recrop) == ((0, 62, 375, 375), (224, 224), None)
    assert "resize" not in ImageOptions(size=224).describe()
    assert ImageOptions(size=224, resize=256).describe()["resize"] == 256
    data = jpeg(375, 500, seed=3)
    assert float(np.abs(preprocess_image(data, ImageOptions(size=224)).astype(np.int16) - pil_reference(data, 224, 224)).mean()) < 6


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(size=224, resize=200), "at least the crop's larger side"),
        (dict(size=(160, 224), resize=200), "at least the crop's larger side (224)"),
        (dict(resize=256), "give --size too"),
        (dict(size=224, resize=256, resize_mode="pad"), "center-crop only, not pad"),
        (dict(size=224, resize=256, resize_mode="stretch"), "center-crop only, not stretch"),
        (dict(size=224, resize=0), "whole number of pixels"),
        (dict(size=224, resize=True), "whole number of pixels"),
    ],
)
def test_resize_refused_in_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(OptionError, match=None) as info:
        ImageOptions(**kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_cli_records_resize_and_verify_source_reproduces_it(tmp_path: Path) -> None:
    src = make_image_folder(tmp_path / "src", classes=2, per_class=3, size=(300, 400))
    dst = tmp_path / "val.lmdb"
    runner = CliRunner()
    done = runner.invoke(cli, ["convert", str(src), str(dst), "--size", "64", "--resize", "80", "--workers", "1", "--quiet"])
    assert done.exit_code == 0, done.output
    env = lmdb.open(str(dst), readonly=True, lock=False, subdir=dst.is_dir())
    with env.begin() as txn:  # the metadata as the lmdb library itself returns it
        raw = txn.get(b"__meta__")
    env.close()
    assert json.loads(raw)["preprocessing"]["resize"] == 80
    checked = runner.invoke(cli, ["verify", str(dst), "--source", str(src)])
    assert checked.exit_code == 0, checked.output
    refused = runner.invoke(cli, ["convert", str(src), str(tmp_path / "x.lmdb"), "--size", "64", "--resize", "32"])
    assert refused.exit_code != 0 and "--resize 32" in refused.output and not (tmp_path / "x.lmdb").exists()


def test_bench_baseline_is_the_usual_pipeline_with_the_same_crop(tmp_path: Path) -> None:
    """``packer bench``'s raw folder is read the usual way (PIL, Resize + CenterCrop) with the crop
    that was packed, so its rows compare the same pictures: PIL's reference pixels, and within the
    bound of what the packed dataset holds."""
    from packer.api import convert
    from packer.bench_timing import UsualFolder, folder_baseline
    from packer.sources.images import scan_image_folder
    from readers import LMDBDataset

    src = make_image_folder(tmp_path / "src", classes=2, per_class=2, size=(375, 500))
    items = [(item.path, item.label) for item in scan_image_folder(src).items]
    image = ImageOptions(size=224, resize=256)
    baseline = folder_baseline(items, image)
    assert isinstance(baseline, UsualFolder)
    packed = LMDBDataset(convert(src, tmp_path / "d.lmdb", image=image, workers=1).dst)
    for i, (path, label) in enumerate(items):
        pixels, got_label = baseline[i]
        assert got_label == label == packed[i][1]
        reference = pil_reference(Path(path).read_bytes(), 256, 224)
        assert np.array_equal(pixels.permute(1, 2, 0).numpy(), reference.astype(np.uint8))
        assert float(np.abs(packed[i][0].numpy().astype(np.int16) - pixels.numpy().astype(np.int16)).mean()) < BOUND
