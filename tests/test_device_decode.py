"""``Loader(..., decode="cuda")`` (readers/device_decode.py), tested on the CPU: the one-line
refusals and errors, and the batches' plumbing with a CPU stand-in for nvImageCodec's decoder
(the same ``decode(list_of_bytes)`` shape). What needs a real GPU is marked to skip without one."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from packer import ImageOptions, convert
from readers import Loader, open_dataset
from readers.device_decode import DeviceDecode
from readers.nvjpeg import GPU_EXTRA, GPUDecoder, GPUDecodeUnavailable
from readers.schema import PackedFormatError
from gpu_stand_in import CPUStandIn

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def jpeg_lmdb(image_folder, tmp_path_factory):
    dst = tmp_path_factory.mktemp("jpeg") / "data.lmdb"
    convert(image_folder, dst, image=ImageOptions(size=32, encoding="jpeg"), workers=1)
    return dst


@pytest.fixture(scope="module")
def png_lmdb(image_folder, tmp_path_factory):
    dst = tmp_path_factory.mktemp("png") / "data.lmdb"
    convert(image_folder, dst, image=ImageOptions(size=32, encoding="png"), workers=1)
    return dst


def _one_line(info) -> str:
    message = str(info.value)
    assert "\n" not in message
    return message


def test_decode_is_checked(lmdb_32):
    with pytest.raises(ValueError, match="choose from cpu, cuda"):
        Loader(open_dataset(lmdb_32), 4, decode="gpu")


def test_raw_and_png_datasets_are_refused(lmdb_32, png_lmdb):
    with pytest.raises(ValueError) as info:
        Loader(open_dataset(lmdb_32), 4, device="cuda", decode="cuda")
    assert "stores raw pixels, so there is nothing to decode" in _one_line(info)
    with pytest.raises(ValueError) as info:
        Loader(open_dataset(png_lmdb), 4, device="cuda", decode="cuda")
    assert "decodes JPEG-stored datasets" in _one_line(info) and "stores png" in str(info.value)


def test_it_needs_a_cuda_device_and_host_gathering(jpeg_lmdb):
    with pytest.raises(ValueError) as info:
        Loader(open_dataset(jpeg_lmdb), 4, decode="cuda")
    assert "pass device='cuda' too" in _one_line(info)
    with pytest.raises(ValueError) as info:
        Loader(open_dataset(jpeg_lmdb), 4, device="cuda", decode="cuda", gather="device")
    assert "drop one of them" in _one_line(info)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_without_cuda_it_is_one_line(jpeg_lmdb):
    """GPUDecodeUnavailable, as the module says, so that one ``except`` falls back to CPU
    decoding on a host without the library and on one without a GPU (a ValueError from the
    device check came first there: a walkthrough)."""
    with pytest.raises(GPUDecodeUnavailable) as info:
        Loader(open_dataset(jpeg_lmdb), 4, device="cuda", decode="cuda")
    assert "no CUDA device is available" in _one_line(info) and str(info.value).startswith("Loader(decode='cuda'):")
    with pytest.raises(GPUDecodeUnavailable) as info:
        DeviceDecode(open_dataset(jpeg_lmdb), torch.device("cuda"))
    assert "no CUDA device is available" in _one_line(info)


def test_without_the_library_it_names_the_extra(jpeg_lmdb, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    with pytest.raises(GPUDecodeUnavailable) as info:
        DeviceDecode(open_dataset(jpeg_lmdb), torch.device("cuda", 0))
    assert GPU_EXTRA in _one_line(info) and str(info.value).startswith("Loader(decode='cuda'):")


def _stand_in(dataset, **kwargs) -> DeviceDecode:
    return DeviceDecode(dataset, torch.device("cpu"), decoder=GPUDecoder("cpu", backend=CPUStandIn(**kwargs)), threads=2, prefetch=2)


def test_batches_match_the_cpu_path(jpeg_lmdb):
    """Same batches (indices, labels, (N, C, H, W) uint8) as the CPU Loader's; pixels from another
    JPEG decoder (OpenCV here, nvJPEG on a GPU) within 2 levels of Pillow's (measured: identical)."""
    dataset = open_dataset(jpeg_lmdb)
    loader = Loader(dataset, 4, seed=1)
    indices = loader.batch_indices()  # (before the pass, which moves the loader on to epoch 1)
    expected = list(loader)
    decoder = _stand_in(dataset)
    got = list(decoder.iterate(indices))
    assert len(got) == len(expected) == 5
    for (images, labels), (want, want_labels) in zip(got, expected):
        assert images.dtype == torch.uint8 and images.shape == want.shape and torch.equal(labels, want_labels)
        assert int((images.int() - want.int()).abs().max()) <= 2


def test_an_undecodable_sample_names_it(jpeg_lmdb):
    decoder = _stand_in(open_dataset(jpeg_lmdb), refuse=1)
    with pytest.raises(PackedFormatError, match=r"data.lmdb: sample 3: the GPU decoder could not decode it"):
        next(decoder.iterate([np.array([3, 4])]))


def test_progress_counts_batches_handed_out(jpeg_lmdb):
    class Progress:
        batches = 0

    progress = Progress()
    it = _stand_in(open_dataset(jpeg_lmdb)).iterate([np.array([0, 1]), np.array([2, 3]), np.array([4])], progress)
    assert len(it) == 3
    next(it), next(it)
    assert progress.batches == 2
    it.close()
    assert list(it) == [] and progress.batches == 2


@needs_gpu
def test_loader_decodes_on_the_gpu(jpeg_lmdb):  # pragma: no cover - needs a GPU and packer[gpu]
    pytest.importorskip("nvidia.nvimgcodec")
    dataset = open_dataset(jpeg_lmdb)
    cpu = Loader(dataset, 4, seed=1)
    gpu = Loader(dataset, 4, seed=1, device="cuda", decode="cuda")
    for (images, labels), (want, want_labels) in zip(gpu, cpu):
        assert images.is_cuda and labels.is_cuda and images.shape == want.shape
        assert torch.equal(labels.cpu(), want_labels) and int((images.cpu().int() - want.int()).abs().max()) <= 8
