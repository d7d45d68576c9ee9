"""The host path of :class:`~readers.loader.Loader`: threads fill whole batches into reused buffers.

* :class:`BatchSource`: what a batch is read from (a store's or dataset's ``read_batch``, else
  ``__getitems__``/``__getitem__``), with the sample shape and dtype.
* :class:`BufferSlot` and :class:`BufferPool`: batch buffers (pinned on CUDA) and the pool that
  reuses them under the loader's ``buffers`` contract (``"checked"``, ``"recycle"``, ``"fresh"``).
* :class:`FillingIterator`: one pass over a list of batches; owns its filling threads, keeps at
  most ``prefetch`` batches in flight, starts each batch's copy to the device on CUDA, and
  raises a filling error at the batch that hit it.
"""

from __future__ import annotations

import collections
import operator
import sys
import threading
from typing import Any, Callable

import numpy as np
import torch

from .cuda import CudaTransfer

__all__ = ["BatchSource", "BufferSlot", "BufferPool", "Progress", "FillingIterator"]


# -- the batch source ------------------------------------------------------------------------
class BatchSource:
    """What the loader reads from: ``fill(indices, out, labels)``, the sample shape and dtype.

    In order of preference: the dataset's torch-free ``.store`` (``read_batch(indices, out)``
    into a numpy array), the dataset's own ``read_batch(indices, out)`` (any batch source, e.g.
    token datasets later), or, slowly, ``__getitems__`` / ``__getitem__`` one sample at a time.
    """

    def __init__(self, dataset: Any) -> None:
        self.length = len(dataset)
        store = getattr(dataset, "store", None)
        target = store if store is not None and hasattr(store, "read_batch") else dataset
        meta = getattr(target, "meta", None)
        if meta is not None and getattr(meta, "fixed_shape", True) is False and getattr(meta, "kind", "image") == "image":
            raise ValueError(
                f"{getattr(target, 'path', dataset)}: samples have different shapes, so they cannot fill one batch "
                "array: convert with --size N (cropped, padded or stretched to it: --resize-mode), or use a DataLoader with a collate_fn"
            )
        self._read_batch: Callable[..., Any] | None = getattr(target, "read_batch", None)
        self._dataset = dataset
        self.batched = self._read_batch is not None
        self.format_name = getattr(target, "format_name", "")
        if meta is not None and getattr(meta, "shape", None) and self.batched:
            self.shape, self.dtype = tuple(int(d) for d in meta.shape), np.dtype(np.uint8)
        elif self.length == 0:
            self.shape, self.dtype = (0,), np.dtype(np.uint8)
        elif self.batched:
            images, _labels = self._read_batch([0])  # type: ignore[misc]
            images = _as_numpy(images)
            self.shape, self.dtype = tuple(images.shape[1:]), images.dtype
        else:
            image, _label = _pair(dataset[0], 0)
            image = _as_numpy(image)
            self.shape, self.dtype = tuple(image.shape), image.dtype

    def fill(self, indices: np.ndarray, out: np.ndarray, labels: np.ndarray) -> None:
        """Write the samples of ``indices`` into ``out`` (N, ...) and their labels into ``labels``."""
        if self._read_batch is not None:
            _images, got = self._read_batch(indices, out)
            labels[...] = _as_numpy(got)
            return
        getitems = getattr(self._dataset, "__getitems__", None)
        samples = getitems(indices.tolist()) if getitems is not None else [self._dataset[int(i)] for i in indices]
        for j, sample in enumerate(samples):
            image, label = _pair(sample, int(indices[j]))
            out[j] = _as_numpy(image)
            labels[j] = _class_label(label, int(indices[j]))


def _pair(sample: Any, index: int) -> tuple[Any, Any]:
    """``sample`` as ``(image, label)``, or one line saying what ``dataset[index]`` gave instead."""
    if isinstance(sample, (tuple, list)) and len(sample) == 2:
        return sample[0], sample[1]
    what = f"a {type(sample).__name__} of {len(sample)}" if isinstance(sample, (tuple, list)) else f"a {type(sample).__name__}"
    raise TypeError(f"Loader: dataset[{index}] must be an (image, label) pair, got {what}")


def _class_label(label: Any, index: int) -> int:
    """``label`` as the integer class label the batch holds (an int, a numpy or torch integer,
    or a one-element array of one); else one line saying what ``dataset[index]`` gave. A float
    was cut to an integer without a word (0.5 became 0), a multi-label tensor was torch's error."""
    value = label
    if isinstance(label, (torch.Tensor, np.ndarray)):
        if label.size == 1 if isinstance(label, np.ndarray) else label.numel() == 1:
            value = label.item()
        else:
            raise TypeError(f"Loader: dataset[{index}]'s label has {tuple(label.shape)} values: Loader batches one integer "
                            "class label per sample; for other targets use a DataLoader")
    if isinstance(value, np.bool_):  # (a mask's `arr[i] > 0`: True is class 1, as int() made it)
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"Loader: dataset[{index}]'s label {value!r} is a {type(value).__name__}: Loader batches one integer "
                        "class label per sample; for other targets use a DataLoader") from None


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


# -- buffers ---------------------------------------------------------------------------------
class BufferSlot:
    """One batch buffer: images (B, ...) and labels (B,), pinned on CUDA, with the copy event."""

    __slots__ = ("images", "labels", "images_np", "labels_np", "base_images", "base_labels", "copied")

    def __init__(self, batch_size: int, shape: tuple[int, ...], dtype: np.dtype, pinned: bool) -> None:
        if pinned:
            torch_dtype = torch.from_numpy(np.empty(0, dtype)).dtype
            self.images: torch.Tensor | None = torch.empty((batch_size, *shape), dtype=torch_dtype, pin_memory=True)
            self.labels: torch.Tensor | None = torch.empty(batch_size, dtype=torch.int64, pin_memory=True)
            self.images_np = self.images.numpy()
            self.labels_np = self.labels.numpy()
        else:
            self.images = self.labels = None
            self.images_np = np.empty((batch_size, *shape), dtype)
            self.labels_np = np.empty(batch_size, np.int64)
        self.copied: Any = None  # the CUDA event recorded after the last copy out of this slot
        self.base_images = sys.getrefcount(self.images_np)
        self.base_labels = sys.getrefcount(self.labels_np)

    @property
    def nbytes(self) -> int:
        return self.images_np.nbytes + self.labels_np.nbytes

    def in_use(self) -> bool:
        """Whether a batch handed out of this slot (or a view of it) is still alive somewhere."""
        return sys.getrefcount(self.images_np) > self.base_images or sys.getrefcount(self.labels_np) > self.base_labels


class BufferPool:
    """Free buffers shared by the iterations of one Loader (so epochs reuse them)."""

    def __init__(self, make: Callable[[], BufferSlot], mode: str, capacity: int) -> None:
        self._make = make
        self._mode = mode
        self._free: list[BufferSlot] = []
        self._lock = threading.Lock()
        self.capacity = capacity
        self.allocated = 0  # buffers ever made
        self.replaced = 0  # times a free buffer was passed over because a batch of it was still alive

    def acquire(self) -> BufferSlot:
        with self._lock:
            for k, slot in enumerate(self._free):
                if self._mode != "checked" or not slot.in_use():
                    return self._free.pop(k)
            if self._free:
                self.replaced += 1
            self.allocated += 1
        return self._make()

    def release(self, slot: BufferSlot) -> None:
        if self._mode == "fresh":
            return
        with self._lock:
            self._free.append(slot)
            while len(self._free) > self.capacity:
                # let go of buffers still held by the consumer first (they are the consumer's now)
                busy = next((k for k, s in enumerate(self._free) if s.in_use()), 0)
                del self._free[busy]

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return sum(slot.nbytes for slot in self._free)


# -- filling ---------------------------------------------------------------------------------
class Progress:
    """The epoch an iteration follows and how many of its batches were handed out (shared with it)."""

    __slots__ = ("epoch", "batches")

    def __init__(self, epoch: int, batches: int) -> None:
        self.epoch, self.batches = epoch, batches


class _Work:
    """State shared by an iteration and its threads (the threads never see the iterator itself,
    so an abandoned iterator is garbage-collected and stops them)."""

    def __init__(self, batches: list[np.ndarray], source: BatchSource, transfer: CudaTransfer | None) -> None:
        self.batches = batches
        self.source = source
        self.transfer = transfer
        self.tasks: "collections.deque[tuple[int, BufferSlot] | None]" = collections.deque()
        self.done: dict[int, tuple[BufferSlot, Any]] = {}
        self.cond = threading.Condition()
        self.stopped = False


def _fill_loop(work: _Work) -> None:
    """A filling thread: take (batch number, buffer), fill it, start its copy on CUDA, report."""
    while True:
        with work.cond:
            while not work.tasks and not work.stopped:
                work.cond.wait()
            if work.stopped:
                return
            task = work.tasks.popleft()
        assert task is not None
        number, slot = task
        result: Any
        try:
            if slot.copied is not None:
                slot.copied.synchronize()  # the previous copy out of this pinned buffer has finished
                slot.copied = None
            indices = work.batches[number]
            n = len(indices)
            work.source.fill(indices, slot.images_np[:n], slot.labels_np[:n])
            if work.transfer is not None:
                assert slot.images is not None and slot.labels is not None
                tensors, event = work.transfer.issue([slot.images[:n], slot.labels[:n]])
                slot.copied = event
                result = (tensors, event)
            else:
                result = n
        except BaseException as exc:  # handed to the consumer, raised there
            result = exc
        with work.cond:
            work.done[number] = (slot, result)
            work.cond.notify_all()


class FillingIterator:
    """One pass over a plan of batches; owns its threads."""

    def __init__(
        self,
        batches: list[np.ndarray],
        source: BatchSource,
        pool: BufferPool,
        transfer: CudaTransfer | None,
        threads: int,
        prefetch: int,
        progress: Progress | None = None,
    ) -> None:
        self._work = _Work(batches, source, transfer)
        self._progress = progress
        self._pool = pool
        self._prefetch = prefetch
        self._next = 0  # next batch to yield
        self._submitted = 0  # batches handed to the threads
        self._lent: collections.deque[BufferSlot] = collections.deque()  # CPU batches handed out, newest last
        self._in_flight: dict[int, BufferSlot] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False
        for k in range(min(threads, len(batches))):
            t = threading.Thread(target=_fill_loop, args=(self._work,), name=f"packer-loader-{k}", daemon=True)
            t.start()
            self._threads.append(t)

    def __iter__(self) -> "FillingIterator":
        return self

    def __len__(self) -> int:
        return len(self._work.batches) - self._next

    @property
    def held_bytes(self) -> int:
        return sum(s.nbytes for s in list(self._lent) + list(self._in_flight.values()))

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        work = self._work
        if self._closed or self._next >= len(work.batches):
            self.close()
            raise StopIteration
        # The batch before the previous one is no longer in the loop variable: its buffer may go back.
        while len(self._lent) > 1:
            self._pool.release(self._lent.popleft())
        while self._submitted < min(self._next + self._prefetch, len(work.batches)):
            slot = self._pool.acquire()
            self._in_flight[self._submitted] = slot
            with work.cond:
                work.tasks.append((self._submitted, slot))
                work.cond.notify()
            self._submitted += 1
        number = self._next
        with work.cond:
            while number not in work.done:
                work.cond.wait()
            slot, result = work.done.pop(number)
        del self._in_flight[number]
        self._next += 1
        if isinstance(result, BaseException):
            self._pool.release(slot)
            self.close()
            raise result
        if self._progress is not None:  # handed out = consumed (what state_dict records)
            self._progress.batches += 1
        if work.transfer is not None:
            tensors, event = result
            work.transfer.hand_over(tensors, event)
            self._pool.release(slot)  # refilled only after `event` (checked by the filling thread)
            return tensors[0], tensors[1]
        n = result
        self._lent.append(slot)
        return torch.from_numpy(slot.images_np[:n]), torch.from_numpy(slot.labels_np[:n])

    def close(self) -> None:
        """Stop and join the threads; return the buffers to the pool."""
        if self._closed:
            return
        self._closed = True
        work = self._work
        with work.cond:
            work.stopped = True
            work.tasks.clear()
            work.cond.notify_all()
        current = threading.current_thread()
        for t in self._threads:
            if t is not current:
                t.join()
        self._threads = []
        work.done.clear()  # their buffers are all in _in_flight (submitted, not yet yielded)
        for slot in self._in_flight.values():
            self._pool.release(slot)  # on CUDA, a pending copy is waited for before any refill
        self._in_flight.clear()
        while self._lent:
            self._pool.release(self._lent.popleft())

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass
