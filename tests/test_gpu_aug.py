"""RandomHorizontalFlip and RandomResizedCrop: batched, seeded, uint8 and float, on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from readers import Normalize, RandomHorizontalFlip, RandomResizedCrop


@pytest.fixture
def batch():
    return torch.randint(0, 256, (8, 3, 20, 20), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


# -- flip --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_flip_flips_exactly_the_chosen_samples(batch, dtype):
    images = batch.to(dtype)
    mask = RandomHorizontalFlip(generator=5).sample(len(images))
    out = RandomHorizontalFlip(generator=5)(images)
    assert 0 < int(mask.sum()) < len(images)  # this seed flips some, not all
    assert out.dtype == dtype and out.shape == images.shape
    for j in range(len(images)):
        assert torch.equal(out[j], images[j].flip(-1) if mask[j] else images[j])


def test_flip_probability_extremes_and_single_image(batch):
    assert torch.equal(RandomHorizontalFlip(p=1.0)(batch), batch.flip(-1))
    assert torch.equal(RandomHorizontalFlip(p=0.0)(batch), batch)
    assert torch.equal(RandomHorizontalFlip(p=1.0)(batch[0]), batch[0].flip(-1))
    with pytest.raises(ValueError, match="p must be"):
        RandomHorizontalFlip(p=1.5)


# -- crop --------------------------------------------------------------------------------------
def test_full_square_crop_at_same_size_is_identity(batch):
    crop = RandomResizedCrop(20, scale=(1, 1), ratio=(1, 1), generator=0)
    assert torch.equal(crop(batch), batch)
    assert torch.allclose(crop(batch.float()), batch.float(), atol=1e-3)


@pytest.mark.parametrize("size", [13, 32])
def test_full_square_crop_is_a_plain_resize(batch, size):
    crop = RandomResizedCrop(size, scale=(1, 1), ratio=(1, 1))
    want = F.interpolate(batch.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=False)
    out = crop(batch.float())
    assert out.dtype == torch.float32 and out.shape == (8, 3, size, size)
    assert torch.allclose(out, want, atol=1e-3)
    as_uint8 = crop(batch)
    assert as_uint8.dtype == torch.uint8
    assert (as_uint8.int() - want.round().int()).abs().max() <= 1


def test_boxes_stay_inside_the_image():
    crop = RandomResizedCrop(16, generator=1)
    for height, width in [(30, 50), (50, 30), (7, 200), (224, 224)]:
        x, y, w, h = crop.sample(4000, height, width).unbind(1)
        assert bool((x >= 0).all() and (y >= 0).all() and (w >= 1).all() and (h >= 1).all())
        assert bool((x + w <= width).all() and (y + h <= height).all())
        assert torch.equal(x, x.round()) and torch.equal(w, w.round())
    # areas follow `scale` where a box fits
    x, y, w, h = RandomResizedCrop(16, scale=(0.25, 0.5), generator=2).sample(2000, 100, 100).unbind(1)
    share = w * h / 10_000
    assert share.min() > 0.22 and share.max() < 0.53


def test_crop_takes_the_box_it_draws(batch):
    crop = RandomResizedCrop((6, 4), generator=3)
    boxes = RandomResizedCrop((6, 4), generator=3).sample(len(batch), 20, 20)
    out = crop(batch.float())
    for j, (x, y, w, h) in enumerate(boxes.int().tolist()):
        region = batch[j : j + 1, :, y : y + h, x : x + w].float()
        want = F.interpolate(region, size=(6, 4), mode="bilinear", align_corners=False)
        assert torch.allclose(out[j], want[0], atol=1e-3)


@pytest.mark.parametrize("size", [16, 64])
def test_an_enlarged_box_repeats_its_own_edge_not_the_pixels_beyond_it(size):
    """A box smaller than the output: the outer output pixels lie past the box's edge pixel
    centres. They took pixels from outside the box (a 4x4 box of 100 in zeros gave 39 at the
    corner; a walkthrough: errors up to 20 of 255 on 256 -> 224 crops); a crop then
    F.interpolate repeats the box's edge, and so does the crop now."""
    image = torch.zeros(1, 1, 12, 12)
    image[:, :, 4:8, 4:8] = 100.0
    assert torch.allclose(RandomResizedCrop(size).crop(image, torch.tensor([[4.0, 4.0, 4.0, 4.0]])), torch.full((1, 1, size, size), 100.0), atol=1e-3)
    images = torch.rand(7, 3, 40, 40, generator=torch.Generator().manual_seed(1)) * 255
    boxes = RandomResizedCrop(size, generator=5).sample(7, 40, 40)
    assert (boxes[:, 2:] < size).any()  # some enlarged
    out = RandomResizedCrop(size).crop(images, boxes)
    for j, (x, y, w, h) in enumerate(boxes.int().tolist()):
        want = F.interpolate(images[j : j + 1, :, y : y + h, x : x + w], size=(size, size), mode="bilinear", align_corners=False)
        assert torch.allclose(out[j], want[0], atol=1e-3)


def test_crop_takes_boxes_from_another_device():
    """sample() draws on the CPU by default; crop() moves the boxes to the images' device (the
    clamp mixed (n, 1, 1) CPU bounds with the images' grid: a review). On the CPU, boxes given
    as float64 or int stand in for it."""
    images = torch.rand(3, 1, 20, 20)
    boxes = RandomResizedCrop(8, generator=1).sample(3, 20, 20)
    want = RandomResizedCrop(8).crop(images, boxes)
    assert torch.equal(RandomResizedCrop(8).crop(images, boxes.double()), want)
    assert torch.equal(RandomResizedCrop(8).crop(images, boxes.int()), want)
    assert RandomResizedCrop(8).crop(images.to("meta"), boxes).shape == (3, 1, 8, 8)  # another device than the boxes'
    if torch.cuda.is_available():
        assert torch.allclose(RandomResizedCrop(8).crop(images.cuda(), boxes).cpu(), want, atol=1e-5)


@pytest.mark.parametrize("module", [lambda g: RandomResizedCrop(12, generator=g), lambda g: RandomHorizontalFlip(generator=g)])
def test_seeded_is_reproducible(batch, module):
    assert torch.equal(module(7)(batch), module(7)(batch))
    seeded = module(7)
    assert not torch.equal(seeded(batch), seeded(batch))  # the generator advances
    generator = torch.Generator().manual_seed(7)
    assert torch.equal(module(generator)(batch), module(7)(batch))


def test_crop_dtypes_and_shapes(batch):
    crop = RandomResizedCrop((10, 14), generator=0)
    assert crop(batch).dtype == torch.uint8 and crop(batch).shape == (8, 3, 10, 14)
    assert crop(batch.double()).dtype == torch.float64
    assert crop(batch[0]).shape == (3, 10, 14)
    with pytest.raises(TypeError, match="uint8 or float"):
        crop(batch.int())
    with pytest.raises(ValueError, match="scale"):
        RandomResizedCrop(8, scale=(0.5, 0.1))
    with pytest.raises(TypeError, match="generator"):
        RandomResizedCrop(8, generator="seed")  # type: ignore[arg-type]


def test_repr_shows_parameters():
    text = repr(RandomResizedCrop(224, generator=0))
    assert "size=(224, 224)" in text and "scale=(0.08, 1.0)" in text and "ratio=(0.75, 1.3333)" in text
    assert "p=0.5" in repr(RandomHorizontalFlip())


def test_pipeline_under_torch_compile(batch):
    """The batched work compiles; drawing from a seeded generator stays outside the graph."""
    pipeline = torch.nn.Sequential(RandomResizedCrop(12, generator=4), RandomHorizontalFlip(generator=4), Normalize())
    eager = torch.nn.Sequential(RandomResizedCrop(12, generator=4), RandomHorizontalFlip(generator=4), Normalize())
    compiled = torch.compile(pipeline, backend="eager")
    assert torch.equal(compiled(batch), eager(batch))


def test_a_size_of_one_item_is_square_as_torchvisions():
    """(224,) was refused; torchvision takes a one-item size as a square (a newcomer walkthrough)."""
    crop = RandomResizedCrop((16,), generator=0)
    assert crop(torch.zeros(2, 3, 20, 20, dtype=torch.uint8)).shape == (2, 3, 16, 16)


@pytest.mark.parametrize("make, says", [
    (lambda: RandomResizedCrop(16.0), "RandomResizedCrop: size must be an integer or 2 integers, got 16.0"),  # ('float' object is not iterable)
    (lambda: RandomResizedCrop((16, 16, 16)), r"RandomResizedCrop: size must be an integer or 2 integers, got \(16, 16, 16\)"),
    (lambda: RandomResizedCrop(True), "RandomResizedCrop: size must be an integer or 2 integers, got True"),
    (lambda: RandomResizedCrop(8, scale=0.5), "RandomResizedCrop: scale must be 2 numbers, got 0.5"),
    (lambda: RandomResizedCrop(8, ratio=("a", 1)), r"RandomResizedCrop: ratio must be 2 numbers, got \('a', 1\)"),
    (lambda: RandomHorizontalFlip("a"), "RandomHorizontalFlip: p must be a number in \\[0, 1\\], got 'a'"),  # (float()'s own error)
])
def test_arguments_of_the_wrong_kind_are_one_line(make, says):
    with pytest.raises(TypeError, match=f"^{says}$"):
        make()


def test_numpy_and_torch_integers_are_sizes():
    import numpy as np

    assert RandomResizedCrop(np.int64(16)).size == (16, 16)
    assert RandomResizedCrop((8, np.int32(4))).size == (8, 4)
    assert RandomResizedCrop(torch.tensor(5)).size == (5, 5)
    assert RandomResizedCrop(np.array([32, 24])).size == (32, 24)  # (an array of sizes has __index__ too: a review)
    assert RandomResizedCrop(torch.tensor([32, 24])).size == (32, 24)


def test_crop_boxes_reach_every_position_including_the_right_and_bottom_edges():
    """torchvision's randint is inclusive of width - w (a mutation sweep: only the upper bound was checked)."""
    from readers.gpu import RandomResizedCrop

    boxes = RandomResizedCrop(8, scale=(0.25, 0.25), ratio=(1, 1), generator=0).sample(4000, 16, 16)
    assert sorted(set(boxes[:, 0].int().tolist())) == list(range(9))  # x in 0..width-w, as torchvision's randint
    assert sorted(set(boxes[:, 1].int().tolist())) == list(range(9))


@pytest.mark.parametrize("height, width", [(100, 10), (10, 100)])
def test_the_fallback_box_is_the_largest_centred_box_with_the_ratio_clamped(height, width):
    """Where no try fits (a 10:1 image), torchvision's fallback: the ratio clamped, centred (a mutation sweep)."""
    from readers.gpu import RandomResizedCrop

    crop = RandomResizedCrop(8, scale=(0.9, 1.0), generator=0)  # no try fits a 10:1 image
    x, y, w, h = crop.sample(1, height, width)[0].tolist()
    if height > width:  # tall: full width, height = width / (3/4)
        assert (w, h) == (width, round(width / crop.ratio[0])) and y == (height - h) // 2
    else:
        assert (w, h) == (round(height * crop.ratio[1]), height) and x == (width - w) // 2
