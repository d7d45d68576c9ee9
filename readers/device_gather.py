"""Batches gathered by the GPU straight out of a RAM-resident blob: no CPU copy at all.

The host path fills each batch with a CPU gather into a pinned buffer and then copies it to the
device: every byte crosses host memory three times (read, write, DMA read), and one CPU thread
gathers at 6.4-7.1 GB/s on an H100 host (the medians of two runs), under a seventh of a pinned
copy to the card in the same runs. Here the blob's pixel array (already in RAM: a memfd, or a mapped file) is
page-locked once with ``cudaHostRegister`` (mapped, read-only), and each batch is one ``index_select`` kernel on a side stream that reads the chosen rows over PCIe
into device memory (on an H100, the medians of two runs: 47.5-47.9 GB/s, 87-93% of a pinned
copy; ``benchmarks/results/gpu.json`` and ``gpu-run1.json``, ``python -m benchmarks.gpu``, rendered in
``benchmarks/RESULTS.md``). Labels live on the device. The CPU only issues one kernel per batch.

With unified addressing (every 64-bit Linux CUDA system) a registered host range has the same
address on the device; this is checked on one sample when the range is registered, and
anything unexpected (a failed registration, a mismatch) falls back to the host path
(``gather="auto"``) or raises (``gather="device"``). Registrations are shared and counted per
range, so several loaders over one dataset register it once; the last one to go unregisters it.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any, Iterator

import numpy as np
import torch

from .dataset import store_of

__all__ = ["DeviceGather", "DeviceGatherUnavailable", "host_arrays"]

_MAPPED, _READ_ONLY = 2, 8  # cudaHostRegisterMapped, cudaHostRegisterReadOnly
#: Batches issued on the side stream ahead of the consumer.
AHEAD = 2


class DeviceGatherUnavailable(RuntimeError):
    """The dataset or the system cannot serve batches by a device-side gather."""


def host_arrays(dataset: Any, *, in_memory_only: bool) -> tuple[np.ndarray, np.ndarray]:
    """The (N, C, H, W) uint8 pixel array and (N,) labels of a fixed-shape raw blob, or raise
    :class:`DeviceGatherUnavailable` saying why not."""
    store = store_of(dataset)
    if store is None or not store.has_pixel_arrays:
        raise DeviceGatherUnavailable(f"{type(dataset).__name__}: only a RAM blob (readers.RAMDataset) can be gathered on the device")
    if in_memory_only and not store.in_memory:
        raise DeviceGatherUnavailable(f"{store.path}: opened with in_memory=False (pass gather='device' to page-lock the mapped file)")
    if store.verify:
        raise DeviceGatherUnavailable(
            f"{store.path}: opened with verify=True, and a device gather would skip the per-sample checksum "
            "check: open it with verify=False to gather on the GPU, or use gather='host' to keep verifying"
        )
    found = store.pixel_arrays()
    if found is None:
        raise DeviceGatherUnavailable(f"{store.path}: only fixed-shape raw samples can be gathered on the device")
    return found


class _Registration:
    """One page-locked host range and its CUDA view; shared by every loader over that range."""

    _lock = threading.Lock()
    _live: dict[tuple[int, int, int], "_Registration"] = {}

    def __init__(self, key: tuple[int, int, int], array: np.ndarray, view: torch.Tensor) -> None:
        self.key, self.array, self.view, self.users = key, array, view, 0

    @classmethod
    def acquire(cls, array: np.ndarray, device: torch.device) -> "_Registration":
        key = (array.ctypes.data, array.nbytes, device.index or 0)
        with cls._lock:
            found = cls._live.get(key)
            if found is None:
                found = cls._live[key] = cls(key, array, _register(array, device))
            found.users += 1
            return found

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            if self.users > 0:
                return
            del self._live[self.key]
        torch.cuda.synchronize(self.key[2])  # no kernel may still read the range
        torch.cuda.cudart().cudaHostUnregister(self.key[0])


class _DeviceView:
    """``__cuda_array_interface__`` for a registered host range (same address on the device)."""

    def __init__(self, array: np.ndarray) -> None:
        self.__cuda_array_interface__ = {
            "shape": array.shape,
            "typestr": array.dtype.str,
            "data": (array.ctypes.data, False),  # torch refuses read-only views; nothing writes to it
            "strides": None,
            "version": 3,
        }


def _register(array: np.ndarray, device: torch.device) -> torch.Tensor:
    if not array.flags.c_contiguous or array.nbytes == 0:
        raise DeviceGatherUnavailable("the pixel array is not one contiguous, non-empty range")
    cudart = torch.cuda.cudart()
    with torch.cuda.device(device):
        error = cudart.cudaHostRegister(array.ctypes.data, array.nbytes, _MAPPED | _READ_ONLY)
        if int(error) != 0:
            raise DeviceGatherUnavailable(f"cudaHostRegister failed ({error}); the host path is used instead")
        try:
            view = torch.as_tensor(_DeviceView(array), device=device)
            if not torch.equal(view[:1].cpu(), torch.from_numpy(np.array(array[:1]))):
                raise DeviceGatherUnavailable("the device does not see registered host memory at its host address")
        except BaseException:
            cudart.cudaHostUnregister(array.ctypes.data)
            raise
    return view


class DeviceGather:
    """Serve batches of ``(images, labels)`` on ``device`` by gathering rows of a registered
    host array with one kernel per batch, ``AHEAD`` batches ahead on a side stream."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, device: torch.device) -> None:
        self.device = device
        self._registration = _Registration.acquire(images, device)
        self._release = weakref.finalize(self, self._registration.release)
        self.images = self._registration.view
        self.labels = torch.from_numpy(np.array(labels, dtype=np.int64)).to(device)  # a copy: the mapped labels are read-only
        self.stream = torch.cuda.Stream(device)
        self._closed = False

    def close(self) -> None:
        """Unregister the host range (once no other loader uses it); unfinished iterations stop."""
        self._closed = True
        self._release()

    def iterate(self, batches: list[np.ndarray], progress: Any = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield each batch of ``batches`` (index arrays), on the consumer's current stream."""
        if not batches:
            return
        sizes = [len(b) for b in batches]
        ends = np.cumsum(sizes)
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            plan = torch.from_numpy(np.concatenate(batches).astype(np.int64, copy=False)).to(self.device, non_blocking=False)
        pending: collections.deque[tuple[torch.Tensor, torch.Tensor, Any]] = collections.deque()
        issued = 0
        while (issued < len(batches) or pending) and not self._closed:
            while issued < len(batches) and len(pending) < AHEAD:
                start = int(ends[issued]) - sizes[issued]
                with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
                    rows = plan[start : int(ends[issued])]
                    images = torch.index_select(self.images, 0, rows)
                    labels = torch.index_select(self.labels, 0, rows)
                    event = torch.cuda.Event()
                    event.record(self.stream)
                pending.append((images, labels, event))
                issued += 1
            images, labels, event = pending.popleft()
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            images.record_stream(current)
            labels.record_stream(current)
            if progress is not None:
                progress.batches += 1
            yield images, labels
