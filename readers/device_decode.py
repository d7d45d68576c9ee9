"""``Loader(..., device="cuda", decode="cuda")``: batches of a JPEG-stored dataset decoded on the GPU.

A dataset converted with ``--encoding jpeg`` is smaller on disk than raw (5.7x for LMDB, 6.2x
for the blob, 224x224 q90: ``read.bytes_on_disk`` in benchmarks/results/gpu_decode.json), but
decoding its samples on the CPU bounds how fast it feeds a GPU. With ``decode="cuda"`` the
:class:`~readers.loader.Loader` reads each batch's stored JPEG bytes in its threads (checking
their checksums as the CPU path does), and the consuming thread decodes the whole batch in one
nvJPEG call (:class:`~readers.nvjpeg.GPUDecoder`, nvImageCodec: ``pip install 'packer[gpu]'``)
into a uint8 ``(N, C, H, W)`` CUDA batch with int64 CUDA labels: the CPU path's contract, the
pixels those of another JPEG decoder (nvJPEG, not libjpeg-turbo: they may differ by a level or
two). Refused in one line for raw datasets (nothing to decode), png-stored ones (not a JPEG) and
text; without CUDA or the library, :class:`~readers.nvjpeg.GPUDecodeUnavailable` says which.

Tested on the CPU (a stand-in decoder on CPU tensors) and on a lent H100, where it read faster
than 16 CPU decoding threads (``python -m benchmarks.gpu_decode --seconds 2``,
benchmarks/results/gpu_decode.json).
"""

from __future__ import annotations

import collections
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .dataset import store_of
from .nvjpeg import GPUDecoder
from .schema import PackedFormatError

__all__ = ["DeviceDecode", "DECODE_MODES", "decodable_store"]

#: Where a :class:`~readers.loader.Loader` decodes encoded samples: the CPU (threads, Pillow) or the GPU.
DECODE_MODES = ("cpu", "cuda")
#: How the option is named in messages.
OPTION = "decode='cuda'"


def decodable_store(dataset: Any) -> Any:
    """The store of ``dataset`` if its samples are JPEGs of one shape; else ValueError, one line."""
    store = store_of(dataset)
    if store is None:
        raise ValueError(f"{OPTION}: reads packer datasets (readers.open_dataset), not a {type(dataset).__name__}")
    store.require_images()
    meta = store.meta
    if meta.encoding == "raw":
        raise ValueError(f"{OPTION}: {store.path} stores raw pixels, so there is nothing to decode; drop decode='cuda'")
    if meta.encoding != "jpeg":
        raise ValueError(f"{OPTION}: decodes JPEG-stored datasets, and {store.path} stores {meta.encoding}; drop decode='cuda'")
    if not meta.fixed_shape:
        raise ValueError(f"{OPTION}: {store.path}'s samples have different shapes, so they cannot fill one batch; convert with a fixed --size")
    return store


class DeviceDecode:
    """Batches of a JPEG-stored ``dataset``: bytes read by ``threads`` threads at most ``prefetch``
    batches ahead, decoded on ``decoder``'s device (see the module doc). ``decoder``: a
    :class:`~readers.nvjpeg.GPUDecoder` (default: nvImageCodec on ``device``)."""

    def __init__(self, dataset: Any, device: torch.device, *, threads: int = 2, prefetch: int = 4, decoder: GPUDecoder | None = None) -> None:
        self.store = decodable_store(dataset)
        self.shape = tuple(int(d) for d in self.store.meta.shape)
        self.decoder = decoder if decoder is not None else GPUDecoder(device, channels=self.shape[0], what=f"Loader({OPTION})")
        self.threads, self.prefetch = max(1, threads), max(1, prefetch)
        self._iterations: "weakref.WeakSet[_Iteration]" = weakref.WeakSet()

    def read(self, indices: np.ndarray) -> tuple[list[bytes], np.ndarray]:
        """The stored bytes and labels of ``indices`` (checked against their checksums when the store verifies)."""
        payloads, labels = [], np.empty(len(indices), np.int64)
        for j, (label, shape, payload) in enumerate(self.store.records(indices)):
            if self.store.verify:
                self.store.check_sample(int(indices[j]), label, shape, payload)
            payloads.append(bytes(payload))
            labels[j] = label
        return payloads, labels

    def decode(self, indices: np.ndarray, payloads: Sequence[bytes], labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch on the device: uint8 ``(N, C, H, W)`` images and int64 ``(N,)`` labels."""
        images = self.decoder.decode(payloads)
        for j, image in enumerate(images):
            if image is None or tuple(image.shape) != self.shape:
                what = "the GPU decoder could not decode it" if image is None else f"decoded to {tuple(image.shape)}, metadata says {self.shape}"
                raise PackedFormatError(f"{self.store.path}: {self.store.where(int(indices[j]))}: {what}")
        batch = torch.stack(images) if images else torch.empty((0, *self.shape), dtype=torch.uint8, device=self.decoder.device)
        return batch, torch.from_numpy(labels).to(self.decoder.device)

    def iterate(self, batches: list[np.ndarray], progress: Any = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One pass over ``batches`` (dataset indices); ``progress.batches`` counts those handed out."""
        iteration = _Iteration(self, batches, progress)
        self._iterations.add(iteration)
        return iteration

    def close(self) -> None:
        """Stop the reading threads of every unfinished pass."""
        for iteration in list(self._iterations):
            iteration.close()


class _Iteration:
    """One pass: its own reading threads, stopped when it ends, is closed or is dropped."""

    def __init__(self, owner: DeviceDecode, batches: list[np.ndarray], progress: Any) -> None:
        self._owner, self._batches, self._progress = owner, batches, progress
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(owner.threads, thread_name_prefix="packer-decode-read")
        self._pending: collections.deque[Future] = collections.deque()
        self._submitted = self._next = 0
        weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)

    def __iter__(self) -> "_Iteration":
        return self

    def __len__(self) -> int:
        return len(self._batches) - self._next

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pool is None or self._next >= len(self._batches):
            self.close()
            raise StopIteration
        while self._submitted < min(self._next + self._owner.prefetch, len(self._batches)):
            self._pending.append(self._pool.submit(self._owner.read, self._batches[self._submitted]))
            self._submitted += 1
        indices = self._batches[self._next]
        try:
            payloads, labels = self._pending.popleft().result()
            batch = self._owner.decode(indices, payloads, labels)
        except BaseException:
            self.close()
            raise
        self._next += 1
        if self._progress is not None:  # handed out = consumed (what Loader.state_dict records)
            self._progress.batches += 1
        return batch

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            self._pending.clear()
