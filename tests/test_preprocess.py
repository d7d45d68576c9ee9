"""Decoding, orientation, mode conversion, resizing and encoding of single images."""

import io

import cv2
import numpy as np
import pytest
from PIL import Image

from imagefiles import gradient, jpeg_bytes, png_bytes
from packer.options import ImageOptions
from packer.preprocess.decode import DecodeError, decode, reduction_for
from packer.preprocess.encode import encode
from packer.preprocess.image import preprocess_image
from packer.preprocess.resize import resize
from packer.samples import natural_image
from readers.codecs import decode_image

LIMIT = 10**8


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def lanczos(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    return np.asarray(Image.fromarray(pixels).resize((width, height), Image.LANCZOS))


# -- resize -------------------------------------------------------------------------------
@pytest.mark.parametrize("src, dst", [((375, 375), (224, 224)), ((600, 800), (224, 298)), ((1200, 1200), (224, 224)), ((1000, 300), (100, 150))])
def test_downscaling_is_antialiased(src, dst):
    pixels = natural_image(np.random.default_rng(1), *src)
    out = resize(pixels, *dst)
    assert out.shape == (*dst, 3) and out.dtype == np.uint8
    reference = lanczos(pixels, *dst)
    aliased = cv2.resize(pixels, dst[::-1], interpolation=cv2.INTER_NEAREST)
    assert psnr(out, reference) > 35
    assert psnr(out, reference) > psnr(aliased, reference) + 3  # clearly better than no filtering


def test_resize_keeps_a_single_channel_axis():
    pixels = natural_image(np.random.default_rng(2), 100, 120)[:, :, :1]
    assert resize(pixels, 50, 60).shape == (50, 60, 1)
    assert resize(pixels, 200, 240).shape == (200, 240, 1)


def test_same_size_is_untouched():
    pixels = gradient(20, 30)
    assert resize(pixels, 20, 30) is pixels


# -- decode -------------------------------------------------------------------------------
@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
@pytest.mark.parametrize("target", [None, (8, 8)])
def test_exif_orientation_is_applied(orientation, target):
    upright = gradient(40, 80)
    # Store the picture rotated the way a camera would, with the tag that undoes it.
    stored = {1: upright, 3: np.rot90(upright, 2), 6: np.rot90(upright, 1), 8: np.rot90(upright, -1)}[orientation]
    data = jpeg_bytes(np.ascontiguousarray(stored), exif_orientation=orientation)
    pixels = decode(data, grayscale=False, target=target, max_pixels=LIMIT)
    if target is None:
        assert pixels.shape == (40, 80, 3)
    else:  # decoded at half scale in the DCT domain, still upright
        assert pixels.shape == (20, 40, 3)
        upright = lanczos(upright, 20, 40)
    assert psnr(pixels, upright) > 28


def test_pillow_and_opencv_paths_agree():
    pixels = natural_image(np.random.default_rng(3), 90, 120)
    data = jpeg_bytes(pixels, quality=95)
    fast = decode(data, grayscale=False, target=None, max_pixels=LIMIT)  # OpenCV path
    slow = decode(data + b"trailing", grayscale=False, target=None, max_pixels=LIMIT)  # Pillow path
    assert fast.shape == slow.shape == (90, 120, 3)
    assert np.abs(fast.astype(int) - slow.astype(int)).max() <= 2


def test_reduced_jpeg_decoding_stays_visually_equal():
    pixels = natural_image(np.random.default_rng(4), 1200, 1600)
    data = jpeg_bytes(pixels, quality=92)
    options = ImageOptions(size=224)
    assert reduction_for(1200, 1600, options.size) == 2
    fast = preprocess_image(data, options)
    full = decode(data, grayscale=False, target=None, max_pixels=LIMIT)
    top, left = 0, (1600 - 1200) // 2
    reference = lanczos(np.ascontiguousarray(full[top:, left : left + 1200]), 224, 224)
    assert fast.shape == (224, 224, 3)
    assert psnr(fast, reference) > 35


def test_truncated_jpeg_is_an_error_not_a_grey_image():
    data = jpeg_bytes(natural_image(np.random.default_rng(5), 120, 160))
    with pytest.raises(DecodeError, match="truncated|cannot decode|not a readable"):
        decode(data[: len(data) // 2], grayscale=False, target=None, max_pixels=LIMIT)


@pytest.mark.parametrize("data, message", [(b"", "empty"), (b"hello, I am text", "not a readable image"), (b"\xff\xd8\xff\xe0" + b"\x00" * 50, "cannot decode|not a readable")])
def test_non_images_are_errors(data, message):
    with pytest.raises(DecodeError, match=message):
        decode(data, grayscale=False, target=None, max_pixels=LIMIT)


def test_pixel_limit_guards_against_decompression_bombs():
    data = png_bytes(Image.new("L", (4000, 3000)))
    with pytest.raises(DecodeError, match="4000x3000 has 12,000,000 pixels, more than --max-pixels 1,000,000"):
        decode(data, grayscale=False, target=None, max_pixels=1_000_000)


def test_palette_with_transparency_becomes_rgb():
    image = Image.new("P", (20, 10))
    image.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    image.paste(1, (10, 0, 20, 10))
    image.info["transparency"] = 0
    pixels = decode(png_bytes(image), grayscale=False, target=None, max_pixels=LIMIT)
    assert pixels.shape == (10, 20, 3)
    assert tuple(pixels[0, 15]) == (0, 0, 255)


def test_rgba_drops_alpha_and_cmyk_becomes_rgb():
    rgba = Image.fromarray(np.dstack([gradient(10, 12), np.full((10, 12), 128, np.uint8)]), "RGBA")
    assert decode(png_bytes(rgba), grayscale=False, target=None, max_pixels=LIMIT).shape == (10, 12, 3)
    cmyk = Image.fromarray(gradient(10, 12)).convert("CMYK")
    buffer = io.BytesIO()
    cmyk.save(buffer, "JPEG")
    out = decode(buffer.getvalue(), grayscale=False, target=None, max_pixels=LIMIT)
    assert out.shape == (10, 12, 3)
    assert psnr(out, gradient(10, 12)) > 25


def test_sixteen_bit_is_scaled_not_clipped():
    values = np.array([[0, 257 * 100, 65535]], np.uint16)
    image = Image.fromarray(values)
    assert image.mode.startswith("I;16")
    out = decode(png_bytes(image), grayscale=True, target=None, max_pixels=LIMIT)
    assert out[0, :, 0].tolist() == [0, 100, 255]


def test_gif_first_frame_and_grayscale():
    frames = [Image.new("RGB", (8, 6), color) for color in ((255, 255, 255), (0, 0, 0))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    out = decode(buffer.getvalue(), grayscale=True, target=None, max_pixels=LIMIT)
    assert out.shape == (6, 8, 1) and int(out.min()) == 255


def test_grayscale_jpeg_gives_one_channel():
    data = jpeg_bytes(gradient(30, 40))
    assert decode(data, grayscale=True, target=None, max_pixels=LIMIT).shape == (30, 40, 1)


# -- encode ---------------------------------------------------------------------------------
def test_raw_encoding_is_planar():
    pixels = gradient(4, 5)
    payload = encode(pixels, "raw")
    assert np.array_equal(np.frombuffer(payload, np.uint8).reshape(3, 4, 5), pixels.transpose(2, 0, 1))


@pytest.mark.parametrize("channels", [1, 3])
def test_png_is_lossless_and_jpeg_is_close(channels):
    pixels = natural_image(np.random.default_rng(6), 48, 64)[:, :, :channels]
    for encoding, floor in (("png", float("inf")), ("jpeg", 25)):  # a noisy picture: JPEG's worst case
        decoded = decode_image(encode(pixels, encoding, 95), channels)
        assert decoded.shape == (channels, 48, 64)
        assert psnr(decoded, pixels.transpose(2, 0, 1)) >= floor, encoding


def test_a_cut_jpeg_closed_with_an_end_marker_is_skipped_not_half_grey():
    """A JPEG cut short then ended with FFD9 passed the end-marker test, and OpenCV decoded its
    missing half grey, a warning its only trace (a walkthrough). libjpeg's 'premature end of data
    segment' now skips it; 'extraneous bytes before marker' (the picture whole) still converts."""
    from packer.preprocess.task import Failed, ImageTask
    from packer.sources.images import ImageItem

    data = jpeg_bytes(natural_image(np.random.default_rng(6), 120, 160))
    task = ImageTask(ImageOptions(size=64))
    cut = task.convert(ImageItem("cut.jpg", 0), data[: len(data) // 2] + b"\xff\xd9")
    assert isinstance(cut, Failed) and cut.reason.startswith("truncated: its JPEG data ends before the picture does")
    extra = task.convert(ImageItem("extra.jpg", 0), data[:-2] + b"abc\xff\xd9")
    whole = task.convert(ImageItem("whole.jpg", 0), data)
    assert not isinstance(extra, Failed) and "extraneous bytes" in extra.decoder_messages
    assert bytes(extra.payload) == bytes(whole.payload)


def test_a_cut_cmyk_jpeg_is_skipped_as_an_rgb_one_is():
    """CMYK JPEGs decode through Pillow, whose libjpeg prints nothing: cut short and closed with
    FFD9, one was stored half grey where an RGB one was skipped (a review)."""
    from packer.preprocess.task import Failed, ImageTask
    from packer.sources.images import ImageItem

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(8).integers(0, 255, (256, 256, 4), dtype=np.uint8), "CMYK").save(buffer, "JPEG", quality=90)
    data = buffer.getvalue()
    task = ImageTask(ImageOptions(size=64))
    cut = task.convert(ImageItem("cut.jpg", 0), data[: len(data) // 2] + b"\xff\xd9")
    assert isinstance(cut, Failed) and cut.reason.startswith("truncated: its JPEG data ends before the picture does")
    whole = task.convert(ImageItem("whole.jpg", 0), data)
    assert not isinstance(whole, Failed) and whole.decoder_messages == ""


def test_palette_with_alpha_keeps_its_colours():
    """A PA image (a Python dataset's) became grey: it went through L (a walkthrough)."""
    from packer.preprocess.decode import to_uint8

    image = Image.new("P", (4, 2))
    image.putpalette([255, 0, 0, 0, 255, 0] + [0] * 762)
    image.paste(1, (2, 0, 4, 2))
    pixels = to_uint8(image.convert("PA"), grayscale=False)
    assert pixels.shape == (2, 4, 3) and tuple(pixels[0, 0]) == (255, 0, 0) and tuple(pixels[0, 3]) == (0, 255, 0)
    assert to_uint8(image.convert("PA"), grayscale=True)[0, 0, 0] == np.asarray(image.convert("L"))[0, 0]


def test_pad_centres_the_image_on_its_canvas():
    """--resize-mode pad centres the image (a mutation sweep: only the plan's sizes were checked)."""
    from packer import ImageOptions
    from packer.preprocess.image import preprocess_pixels

    out = preprocess_pixels(np.full((20, 40, 3), 200, np.uint8), ImageOptions(size=(40, 40), resize_mode="pad"))
    rows = np.flatnonzero(out[:, :, 0].max(1) > 0)
    assert (rows.min(), rows.max()) == (10, 29)
    out = preprocess_pixels(np.full((40, 20, 3), 200, np.uint8), ImageOptions(size=(40, 40), resize_mode="pad"))
    cols = np.flatnonzero(out[:, :, 0].max(0) > 0)
    assert (cols.min(), cols.max()) == (10, 29)
