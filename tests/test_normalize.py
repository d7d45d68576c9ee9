import pytest
import torch

from readers import Normalize
from readers.gpu import IMAGENET_MEAN, IMAGENET_STD


def reference(images: torch.Tensor, mean, std) -> torch.Tensor:
    x = images.double() / 255
    m = torch.tensor(mean, dtype=torch.float64).reshape(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).reshape(-1, 1, 1)
    return (x - m) / s


@pytest.fixture
def batch():
    return torch.randint(0, 256, (4, 3, 17, 19), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def test_matches_float64_reference_to_float32_rounding(batch):
    out = Normalize()(batch)
    want = reference(batch, IMAGENET_MEAN, IMAGENET_STD)
    assert out.dtype == torch.float32 and out.shape == batch.shape
    # within a few float32 ulps of the exact value (|values| < 2.7, ulp there ~2.4e-7)
    assert (out.double() - want).abs().max().item() < 1e-6
    # every uint8 value, every channel
    every = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 1, 256).expand(1, 3, 1, 256)
    assert (Normalize()(every).double() - reference(every, IMAGENET_MEAN, IMAGENET_STD)).abs().max().item() < 1e-6


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_output_dtypes_round_once(batch, dtype):
    out = Normalize(dtype=dtype)(batch)
    want = reference(batch, IMAGENET_MEAN, IMAGENET_STD)
    assert out.dtype == dtype
    assert torch.equal(out, want.to(dtype)) or (out.double() - want).abs().max() <= torch.finfo(dtype).eps * 4


def test_single_image_and_grayscale():
    image = torch.full((1, 5, 5), 255, dtype=torch.uint8)
    out = Normalize(mean=[0.5], std=[0.25])(image)
    assert out.shape == (1, 5, 5) and torch.allclose(out, torch.full_like(out, 2.0))


def test_channels_last_output(batch):
    out = Normalize(channels_last=True)(batch)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, Normalize()(batch))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_channels_last_costs_no_pass_of_its_own(batch, dtype):
    """The uint8 batch is cast straight into channels-last: the same aten operations as without
    it, where the float output was copied once more into the other layout (a walkthrough)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    counts = []
    for channels_last in (False, True):
        module = Normalize(dtype=dtype, channels_last=channels_last)
        with Ops() as ops:
            module(batch)
        counts.append(sum(name in ("aten._to_copy", "aten.copy_", "aten.clone", "aten.contiguous") for name in ops.names))
    assert counts[1] == counts[0]


def test_constants_are_buffers_that_follow_dtype_moves(batch):
    """The constants are registered buffers (they move with the module), and a cast of the module
    (``.double()``, ``.half()``, ``model.to(torch.bfloat16)``) is its output dtype, as for any torch
    module; below float32 the constants stay float32 (bf16 ones lost precision: tests/test_api_edges_a.py)."""
    module = Normalize()
    assert {name for name, _ in module.named_buffers()} == {"scale", "shift"}
    assert module.scale.dtype == torch.float32
    double = Normalize().double()
    assert double.scale.dtype == double.shift.dtype == torch.float64
    out = double(batch)
    assert out.dtype == torch.float64
    assert (out - reference(batch, IMAGENET_MEAN, IMAGENET_STD)).abs().max().item() < 1e-6
    half = Normalize().half()
    assert half.scale.dtype == half.shift.dtype == torch.float32 and half(batch).dtype == torch.float16


def test_state_dict_round_trip_carries_the_constants(batch):
    """A module built with other constants computes the saved one's output after ``load_state_dict``."""
    saved = Normalize(mean=[0.1, 0.2, 0.3], std=[0.5, 0.25, 0.125])
    assert set(saved.state_dict()) == {"scale", "shift"}
    other = Normalize()
    assert not torch.equal(other(batch), saved(batch))
    other.load_state_dict(saved.state_dict())
    assert torch.equal(other(batch), saved(batch))


def test_buffers_move_to_another_device(batch):
    """``.to(device)`` moves the constants: on the ``meta`` device (no data, any machine) the
    module runs on meta tensors and keeps shapes and dtypes."""
    module = Normalize(channels_last=True).to("meta")
    assert module.scale.device.type == module.shift.device.type == "meta"
    out = module(batch.to("meta"))
    assert out.device.type == "meta" and out.shape == batch.shape and out.dtype == torch.float32
    with pytest.raises((RuntimeError, NotImplementedError)):
        module(batch)  # CPU images with meta constants: the module really moved


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_buffers_move_to_cuda(batch):
    module = Normalize().to("cuda")
    assert module.scale.is_cuda and module.shift.is_cuda
    out = module(batch.cuda())
    assert out.is_cuda
    assert (out.double().cpu() - reference(batch, IMAGENET_MEAN, IMAGENET_STD)).abs().max().item() < 1e-6


def test_channels_last_input_is_fine(batch):
    assert torch.equal(Normalize()(batch.contiguous(memory_format=torch.channels_last)), Normalize()(batch))


@pytest.mark.parametrize(
    "kwargs, images, error",
    [
        ({}, torch.zeros(3, 4, 4), TypeError),
        ({}, torch.zeros(2, 4, 4, dtype=torch.uint8), ValueError),
        ({}, torch.zeros(4, 4, dtype=torch.uint8), ValueError),
    ],
)
def test_bad_input_is_refused(kwargs, images, error):
    with pytest.raises(error):
        Normalize(**kwargs)(images)


def test_bad_construction_is_refused():
    with pytest.raises(ValueError, match="positive"):
        Normalize(std=[0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="3 values but std has 2"):
        Normalize(mean=[0.1, 0.2, 0.3], std=[1.0, 1.0])
    with pytest.raises(ValueError, match="floating"):
        Normalize(dtype=torch.int32)


def test_repr_shows_parameters():
    assert "mean=[0.485, 0.456, 0.406]" in repr(Normalize())


def test_captures_as_one_graph(batch):
    compiled = torch.compile(Normalize(), backend="eager", fullgraph=True)
    assert torch.equal(compiled(batch), Normalize()(batch))


@pytest.mark.slow
def test_compiles_with_inductor(batch):
    """The real compiler (C++ codegen on the CPU, Triton on CUDA): fused, within an ulp."""
    compiled = torch.compile(Normalize(channels_last=True), fullgraph=True)
    out = compiled(batch)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert (out.double() - reference(batch, IMAGENET_MEAN, IMAGENET_STD)).abs().max().item() < 1e-6


def test_grayscale_images_with_imagenet_defaults_say_what_to_pass():
    """``--grayscale`` data through the default (3-channel ImageNet) values: one line saying what
    to pass; one value of each then applies to the one channel."""
    gray = torch.randint(0, 256, (2, 1, 4, 4), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"3 channel values but the images have 1 channel: pass 1 mean and 1 std value .*Normalize\(mean=\[m\], std=\[s\]\)"):
        Normalize()(gray)
    out = Normalize(mean=[0.5], std=[0.25])(gray)
    assert torch.allclose(out.double(), (gray.double() / 255 - 0.5) / 0.25, atol=1e-5)


def test_channels_last_images_get_a_hint():
    """An (N, H, W, C) batch was told to pass 32 mean values (a walkthrough): the message asks
    whether it is channels-last and says how to permute; (N, C, H, W) input of 1 channel does not."""
    hwc = torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"or are these images channels-last, \(N, H, W, C\)\? .*permute\(0, 3, 1, 2\)"):
        Normalize()(hwc)
    with pytest.raises(ValueError) as info:
        Normalize()(torch.zeros(2, 1, 4, 4, dtype=torch.uint8))
    assert "channels-last" not in str(info.value)

