"""The CUDA paths on a real GPU: skipped without one (CI has none; run on a lent GPU machine).

What can only go wrong on a device: a pinned buffer refilled while its copy is still in flight,
a batch read on the consumer stream before its copy has finished, device and CPU augmentation
drifting apart, and the example's mixed-precision loop.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from readers import CUDAPrefetcher, LMDBDataset, Loader, Normalize, RandomHorizontalFlip, RandomResizedCrop
from readers.open import open_dataset

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ROOT = Path(__file__).resolve().parents[1]
#: GPU cycles a slow consumer spends per batch: long enough that an unsynchronised refill of a
#: pinned buffer or an early read of a copy would show up as wrong pixels.
SLOW_CYCLES = 20_000_000


@pytest.fixture
def ds(lmdb_32):
    return LMDBDataset(lmdb_32)


def expected(ds, indices) -> torch.Tensor:
    return torch.stack([ds[int(i)][0] for i in indices])


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "blob", "webdataset"])
@pytest.mark.parametrize("buffers", ["checked", "recycle", "fresh"])
def test_loader_batches_on_the_device_equal_the_stored_pixels(packed_32, fmt, buffers):
    ds = open_dataset(packed_32(fmt))
    loader = Loader(ds, 4, device="cuda", seed=3, threads=2, prefetch=3, buffers=buffers)
    kept = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for (images, labels), indices in zip(loader, loader.batch_indices()):
            assert images.is_cuda and labels.is_cuda and images.dtype == torch.uint8
            torch.cuda._sleep(SLOW_CYCLES)  # a slow consumer: the loader runs ahead meanwhile
            kept.append((images, labels, indices))
    torch.cuda.synchronize()
    for images, labels, indices in kept:  # every batch is still intact after later refills
        assert torch.equal(images.cpu(), expected(ds, indices))
        assert labels.cpu().tolist() == [ds[int(i)][1] for i in indices]


def test_loader_on_the_device_keeps_no_extra_buffers_after_the_first_epoch(ds):
    loader = Loader(ds, 4, device="cuda", seed=0, threads=2, prefetch=2)
    for _ in loader:
        pass
    first = loader.buffers_allocated
    for epoch in range(1, 4):
        loader.set_epoch(epoch)
        for images, _labels in loader:
            images.float().mean()  # use and drop each batch, as a training step does
    assert loader.buffers_allocated == first <= loader.prefetch + 2


@pytest.mark.parametrize("pin_memory", [False, True])
def test_prefetcher_over_a_plain_dataloader(ds, pin_memory):
    plain = DataLoader(ds, batch_size=4, pin_memory=pin_memory)
    got = []
    for images, labels in CUDAPrefetcher(plain):
        assert images.is_cuda and labels.is_cuda
        torch.cuda._sleep(SLOW_CYCLES)
        got.append((images, labels))
    torch.cuda.synchronize()
    want = list(DataLoader(ds, batch_size=4))
    assert len(got) == len(want) == 5
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(a.cpu(), b) and torch.equal(la.cpu(), lb)


def test_prefetcher_over_a_cpu_loader_with_recycled_buffers(ds):
    loader = Loader(ds, 4, shuffle=True, seed=5, buffers="recycle")
    order = [idx for idx in loader.batch_indices()]
    for (images, _labels), indices in zip(CUDAPrefetcher(loader), order):
        torch.cuda._sleep(SLOW_CYCLES)
        assert torch.equal(images.cpu(), expected(ds, indices))


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_normalize_on_the_device_matches_the_cpu(channels_last, dtype):
    images = torch.randint(0, 256, (6, 3, 17, 23), dtype=torch.uint8)
    norm = Normalize(dtype=dtype, channels_last=channels_last)
    on_cpu = norm(images)
    on_gpu = norm.cuda()(images.cuda())
    assert on_gpu.dtype == dtype and on_gpu.is_cuda
    if channels_last:
        assert on_gpu.is_contiguous(memory_format=torch.channels_last)
    tolerance = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    assert torch.allclose(on_gpu.cpu().float(), on_cpu.float(), atol=tolerance, rtol=0)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_seeded_augmentation_draws_the_same_boxes_and_flips_on_the_device(dtype):
    images = torch.randint(0, 256, (16, 3, 40, 48), dtype=torch.uint8).to(dtype)
    crop_cpu, crop_gpu = RandomResizedCrop(24, generator=7), RandomResizedCrop(24, generator=7).cuda()
    flip_cpu, flip_gpu = RandomHorizontalFlip(generator=9), RandomHorizontalFlip(generator=9).cuda()
    assert torch.equal(crop_cpu.sample(16, 40, 48), crop_gpu.sample(16, 40, 48, "cuda").cpu())
    assert torch.equal(flip_cpu.sample(16), flip_gpu.sample(16, "cuda").cpu())
    on_cpu = flip_cpu(crop_cpu(images))
    on_gpu = flip_gpu(crop_gpu(images.cuda()))
    assert on_gpu.is_cuda and on_gpu.dtype == dtype and on_gpu.shape == (16, 3, 24, 24)
    # bilinear sampling on two devices: the same up to float rounding (one grey level for uint8;
    # the GPU's fused multiply-adds differ from the CPU's by ~1e-5 of the 0..255 range for float)
    assert (on_gpu.cpu().float() - on_cpu.float()).abs().max() <= (1 if dtype == torch.uint8 else 1e-2)


def test_augmentation_with_the_global_generator_runs_on_the_device():
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, device="cuda")
    out = RandomHorizontalFlip()(RandomResizedCrop(16)(images))
    assert out.is_cuda and out.shape == (8, 3, 16, 16)


def test_example_trains_with_mixed_precision_on_the_gpu():
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_classifier.py"), "--steps", "4", "--device", "cuda"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loss" in done.stdout.lower()


# -- the device-side gather from a RAM blob ----------------------------------------------------
@pytest.fixture
def blob(packed_32):
    from readers import RAMDataset

    return RAMDataset(packed_32("blob"))


def test_a_ram_blob_is_gathered_on_the_device_by_default(blob):
    loader = Loader(blob, 4, device="cuda", seed=1)
    assert loader.gather == "device"
    kept = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for (images, labels), indices in zip(loader, loader.batch_indices()):
            assert images.is_cuda and images.dtype == torch.uint8 and images.shape[1:] == (3, 32, 32)
            torch.cuda._sleep(SLOW_CYCLES)
            kept.append((images, labels, indices))
    torch.cuda.synchronize()
    assert len(kept) == 3 * len(loader)
    for images, labels, indices in kept:
        assert torch.equal(images.cpu(), expected(blob, indices))
        assert labels.cpu().tolist() == [blob[int(i)][1] for i in indices]
    loader.close()


def test_device_gather_matches_the_host_path_and_resumes_mid_epoch(blob):
    on_device = Loader(blob, 5, device="cuda", seed=4, gather="device")
    on_host = Loader(blob, 5, device="cuda", seed=4, gather="host")
    assert on_host.gather == "host"
    for (a, la), (b, lb) in zip(on_device, on_host):
        assert torch.equal(a, b) and torch.equal(la, lb)
    it = iter(on_device)
    next(it)
    state = on_device.state_dict()
    resumed = Loader(blob, 5, device="cuda", seed=4)
    resumed.load_state_dict(state)
    rest = [images.cpu() for images, _ in resumed]
    want = [expected(blob, idx) for idx in on_device.batch_indices()[1:]]
    assert len(rest) == len(want) and all(torch.equal(a, b) for a, b in zip(rest, want))
    for loader in (on_device, on_host, resumed):
        loader.close()


def test_loaders_share_one_registration_and_the_last_one_unregisters(blob):
    import gc

    from readers.device_gather import _Registration

    gc.collect()  # loaders of earlier tests let go of their registrations
    assert not _Registration._live
    first, second = Loader(blob, 4, device="cuda"), Loader(blob, 4, device="cuda")
    assert len(_Registration._live) == 1 and next(iter(_Registration._live.values())).users == 2
    first.close()
    assert sum(len(x) for x, _ in second) == len(blob)
    second.close()
    assert not _Registration._live
    again = Loader(blob, 4, device="cuda", shuffle=False)  # registers afresh
    assert torch.equal(next(iter(again))[0].cpu(), expected(blob, range(4)))
    again.close()


def test_gather_modes_fall_back_or_explain(packed_32):
    from readers import RAMDataset

    assert Loader(open_dataset(packed_32("lmdb")), 4, device="cuda").gather == "host"
    assert Loader(RAMDataset(packed_32("blob"), in_memory=False), 4, device="cuda").gather == "host"
    mapped = Loader(RAMDataset(packed_32("blob"), in_memory=False), 4, device="cuda", gather="device", shuffle=False)
    assert mapped.gather == "device"
    assert torch.equal(next(iter(mapped))[0].cpu(), expected(RAMDataset(packed_32("blob")), range(4)))
    mapped.close()
    with pytest.raises(ValueError, match="only a RAM blob"):
        Loader(open_dataset(packed_32("lmdb")), 4, device="cuda", gather="device")


def test_closing_a_device_gather_loader_ends_its_iteration(blob):
    loader = Loader(blob, 4, device="cuda")
    it = iter(loader)
    next(it)
    loader.close()  # the blob is unregistered: nothing may read it any more
    assert list(it) == []
