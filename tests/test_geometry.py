import pytest

from packer.preprocess.geometry import RESIZE_MODES, plan_for
from packer.options import ImageOptions
from packer.errors import OptionError

SOURCES = [(375, 500), (500, 375), (100, 100), (31, 997), (1, 1)]


@pytest.mark.parametrize("h, w", SOURCES)
@pytest.mark.parametrize("size", [(224, 224), (160, 224), (224, 160)])
def test_center_crop_pad_stretch_give_exactly_the_size(h, w, size):
    for mode in ("center-crop", "pad", "stretch"):
        assert plan_for(mode, h, w, size).output == size, mode


@pytest.mark.parametrize("h, w", SOURCES)
def test_center_crop_keeps_aspect_and_centres(h, w):
    plan = plan_for("center-crop", h, w, (224, 224))
    top, left, ch, cw = plan.crop
    assert ch == cw or ch == h or cw == w  # a square region of the source (clipped to it)
    assert abs(top - (h - ch - top)) <= 1 and abs(left - (w - cw - left)) <= 1


@pytest.mark.parametrize("h, w", SOURCES)
def test_pad_fits_inside_keeping_aspect(h, w):
    plan = plan_for("pad", h, w, (224, 224))
    rh, rw = plan.resize
    assert rh <= 224 and rw <= 224 and max(rh, rw) == 224
    assert abs(rh / rw - h / w) <= max(h / w, w / h) * 0.05 + 1 / min(rh, rw)


@pytest.mark.parametrize("h, w", SOURCES)
def test_shorter_sets_the_shorter_side(h, w):
    rh, rw = plan_for("shorter", h, w, (64, 64)).output
    assert min(rh, rw) == 64
    assert (rh >= rw) == (h >= w)


def test_none_keeps_the_original():
    assert plan_for("none", 123, 45, None).output == (123, 45)


def test_every_mode_is_documented_in_the_options():
    for mode in RESIZE_MODES:
        ImageOptions(size=None if mode == "none" else 32, resize_mode=mode)


def test_unknown_mode_lists_the_valid_ones():
    with pytest.raises(ValueError, match="center-crop, pad, stretch, shorter, none"):
        plan_for("zoom", 10, 10, (5, 5))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(size=0), "between 1 and 65535"),
        (dict(size="12y4"), "N or HxW"),
        (dict(size=32, resize_mode="none"), "drop --size"),
        (dict(resize_mode="pad"), "needs --size"),
        (dict(size="32x48", resize_mode="shorter"), "one number"),
        (dict(size=32, encoding="gif"), "unknown encoding"),
        (dict(size=32, quality=0), "quality"),
        (dict(size=32, resize_mode="zoom"), "unknown mode"),
    ],
)
def test_bad_options_raise_option_error(kwargs, message):
    with pytest.raises(OptionError, match=message):
        ImageOptions(**kwargs)


def test_size_parsing():
    assert ImageOptions(size="160x224").size == (160, 224)
    assert ImageOptions(size=64).size == (64, 64)
    assert ImageOptions(size=64).resize_mode == "center-crop"
    assert ImageOptions().resize_mode == "none"


def test_an_output_that_enlarges_inputs_is_said(tmp_path, caplog):
    """``--size 64`` on 48x40 images wrote 64x64 without a word (the FFCV-persona walkthrough):
    the conversion now says how many sampled inputs it enlarges; none at a size they cover. The stored size is checked with Pillow's own reading."""
    import logging

    from PIL import Image

    import packer
    from packer.samples import make_image_folder
    from readers import open_dataset

    src = make_image_folder(tmp_path / "small", classes=2, per_class=3, size=(40, 48))
    assert Image.open(next(src.rglob("*.jpg"))).size == (48, 40)
    with caplog.at_level(logging.WARNING, logger="packer"):
        packer.convert(src, tmp_path / "big.blob", image=ImageOptions(size=64), workers=1)
    [said] = [r.getMessage() for r in caplog.records if "enlarged" in r.getMessage()]
    assert said.startswith("6 of 6 inputs sampled are smaller than --size 64x64 needs and will be enlarged (e.g. ")
    assert said.endswith(", 48x40, width x height): upsampling adds bytes, not detail; smaller sizes keep them as they are")
    assert open_dataset(tmp_path / "big.blob")[0][0].shape == (3, 64, 64)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="packer"):
        packer.convert(src, tmp_path / "fit.blob", image=ImageOptions(size=32), workers=1)
        packer.convert(src, tmp_path / "wide.blob", image=ImageOptions(size=(40, 48)), workers=1)
    assert not [r for r in caplog.records if "enlarged" in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="packer"):  # the enlargement of --resize, named
        packer.convert(src, tmp_path / "resized.blob", image=ImageOptions(size=32, resize=44), workers=1)
    assert [r.getMessage() for r in caplog.records if "smaller than --size 32x32 --resize 44 needs" in r.getMessage()]


@pytest.mark.parametrize("suffix", [".jpg", ".tif"])
def test_the_enlargement_warning_sees_pictures_as_exif_turns_them(tmp_path, caplog, suffix):
    """Stored 48 wide x 24 high with EXIF orientation 6 (shown 24 x 48): --size 48x24 (height x
    width) covers them as shown, and nothing is said; --size 24x48 enlarges them, and is said.
    A TIFF's size Pillow gives already turned: it was turned twice (a newcomer walkthrough)."""
    import logging

    import numpy as np
    from PIL import Image

    import packer

    src = tmp_path / "turned"
    src.mkdir()
    for i in range(3):
        picture = Image.fromarray(np.random.default_rng(i).integers(0, 255, (24, 48, 3), dtype=np.uint8))
        exif = picture.getexif()
        exif[0x0112] = 6
        picture.save(src / f"{i}{suffix}", exif=exif)
    with caplog.at_level(logging.WARNING, logger="packer"):
        report = packer.convert(src, tmp_path / "fits.blob", image=ImageOptions(size=(48, 24), resize_mode="stretch"), workers=1)
    assert report.written == 3 and not [r for r in caplog.records if "enlarged" in r.getMessage()]
    with caplog.at_level(logging.WARNING, logger="packer"):
        packer.convert(src, tmp_path / "wide.blob", image=ImageOptions(size=(24, 48), resize_mode="stretch"), workers=1)
    [said] = [r.getMessage() for r in caplog.records if "enlarged" in r.getMessage()]
    assert "3 of 3 inputs" in said and ", 24x48, width x height)" in said
