"""``Loader``: whole batches of a map-style dataset, filled ahead by threads, optionally on CUDA.

Why threads and not DataLoader worker processes: a batch of packed raw pixels needs no
decoding, only copying (an LMDB read, a numpy gather, a file read), and those release the GIL.
Worker processes must send every batch through shared memory to the training process, which
caps them at about 1.1 GB/s on our machines (~7,800 images/s of 224x224x3 uint8, even for a
dataset that does nothing). Threads of the training process fill preallocated batch arrays in
place instead, so one batch costs one copy out of storage and nothing else.

Pipeline: the epoch's index plan (shuffled by ``seed`` and the epoch, split between
distributed ranks) is cut into batches; ``threads`` threads each fill a whole batch, at most
``prefetch`` batches ahead of the consumer, into a small pool of reused buffers, through the
dataset's ``read_batch(indices, out)`` (a :class:`~readers.formats.base.Store` reads the whole
batch in one call, straight into the buffer). On CUDA the buffers are pinned and each filled
batch is copied to the device asynchronously on a separate stream (:class:`~readers.cuda.CUDAPrefetcher`
offers that part alone, over any iterable of batches). A RAM blob on CUDA skips all of that: the
GPU gathers each batch straight out of the page-locked blob (:mod:`readers.device_gather`).

The buffer contract (``buffers=``), for CPU batches; CUDA batches are always fresh device
tensors that nothing overwrites:

* ``"checked"`` (default, safe): a buffer is refilled only when nothing references the batch
  that was handed out of it any more (every tensor, view and ``.numpy()`` array of a batch
  keeps the buffer's reference count up, which is checked before reuse); a batch you keep is
  simply not reused, and a new buffer takes its place. Costs nothing in a normal loop.
* ``"recycle"`` (fast, by contract): a yielded batch stays valid until you ask for the batch
  after the next one (so ``for images, labels in loader`` with work on the current batch is
  fine; ``.clone()`` anything you keep longer); a finished iteration's last batches stay valid
  until the next iteration starts. No check at all.
* ``"fresh"``: a new buffer for every batch, never reused (what DataLoader does).
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import weakref
from typing import Any, Callable, Iterator, Literal

import numpy as np
import torch

from .cuda import CudaTransfer, resolve_device

__all__ = ["Loader", "BUFFER_MODES", "GATHER_MODES", "default_threads"]

BUFFER_MODES = ("checked", "recycle", "fresh")
BufferMode = Literal["checked", "recycle", "fresh"]
GATHER_MODES = ("auto", "host", "device")
GatherMode = Literal["auto", "host", "device"]

#: Most threads ever chosen by default. Measured (benchmarks/loader.py, 2 shared cores, batch
#: 256 of 224x224x3): LMDB 26.8k img/s at 1 thread, 39.7k at 2, 28.4k at 3, 23.5k at 4 -- more
#: threads than cores only add contention, and a few threads already reach memory bandwidth.
_MAX_DEFAULT_THREADS = 4


def default_threads(dataset: Any = None) -> int:
    """Filling threads used when ``threads`` is not given: one per core (up to 4).

    One when the store says its reads serialise on a process-wide lock (``serial_reads``: HDF5
    read through h5py), where more threads only add contention; that one still fills in the
    background, overlapping training.
    """
    store = getattr(dataset, "store", dataset)
    if getattr(store, "serial_reads", False):
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(_MAX_DEFAULT_THREADS, cores))


# -- the batch source ------------------------------------------------------------------------
class _Source:
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
                "array: convert with --resize-mode center-crop, pad or stretch, or use a DataLoader with a collate_fn"
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
            image, _label = dataset[0]
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
        for j, (image, label) in enumerate(samples):
            out[j] = _as_numpy(image)
            labels[j] = int(label)


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


# -- buffers ---------------------------------------------------------------------------------
class _Slot:
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


class _Pool:
    """Free buffers shared by the iterations of one Loader (so epochs reuse them)."""

    def __init__(self, make: Callable[[], _Slot], mode: str, capacity: int) -> None:
        self._make = make
        self._mode = mode
        self._free: list[_Slot] = []
        self._lock = threading.Lock()
        self.capacity = capacity
        self.allocated = 0  # buffers ever made
        self.replaced = 0  # times a free buffer was passed over because a batch of it was still alive

    def acquire(self) -> _Slot:
        with self._lock:
            for k, slot in enumerate(self._free):
                if self._mode != "checked" or not slot.in_use():
                    return self._free.pop(k)
            if self._free:
                self.replaced += 1
            self.allocated += 1
        return self._make()

    def release(self, slot: _Slot) -> None:
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


# -- the loader ------------------------------------------------------------------------------
class Loader:
    """Batches ``(images, labels)`` of a map-style dataset: uint8 ``(N, C, H, W)`` and int64 ``(N,)``.

    ``dataset`` is any packer reader (anything with ``.store`` or ``read_batch(indices, out)``);
    a plain torch Dataset works too, slowly, through ``__getitems__``/``__getitem__``.

    * Order: a permutation drawn from ``(seed, epoch)`` when ``shuffle`` (call
      :meth:`set_epoch` before each epoch, like ``DistributedSampler``: same seed and epoch,
      same order), else index order.
    * Distributed: ``rank`` and ``world_size`` (default: from ``torch.distributed`` when it is
      initialised, else one process) give each rank every ``world_size``-th sample of the
      epoch's order. Every rank gets the same number of samples and batches: without
      ``drop_last`` the order is padded by repeating its first samples (at most
      ``world_size - 1``), and a shorter last batch is kept; with ``drop_last`` the tail that
      does not divide evenly is dropped, and so is a shorter last batch.
    * Background: ``threads`` threads (default :func:`default_threads`) fill whole batches at
      most ``prefetch`` batches ahead (default: ``2 * threads``) into reused buffers; the
      ``buffers`` contract (``"checked"``, ``"recycle"``, ``"fresh"``) is in the module docstring.
      Errors raised while filling a batch are raised by the iteration at that batch.
    * ``device``: ``None``/``"cpu"``: CPU tensors. ``"cuda[:N]"``: batches are filled into
      pinned host buffers, copied asynchronously on a side stream, and yielded as device tensors
      that the current stream may use at once.
    * ``gather`` (CUDA only): ``"auto"`` (default) gathers batches of an in-memory RAM blob
      (:class:`~readers.blob.RAMDataset`, fixed-shape raw) on the GPU, straight out of the
      page-locked blob, with no filling threads and no CPU copy (:mod:`readers.device_gather`;
      page-locking costs ~0.4 s per GB once per process), and uses the host path for anything
      else; ``"device"`` insists (an error says why it cannot; a mapped blob is page-locked
      too); ``"host"`` always fills pinned buffers in threads.

    * Resume: :meth:`state_dict` records the epoch and how many batches of it this rank has
      consumed; a new Loader over the same dataset and settings given it by
      :meth:`load_state_dict` yields exactly the remaining batches of that epoch on its next
      iteration (the plan is a pure function of seed, epoch, rank and world size, so nothing
      is repeated or skipped), then whole epochs again after :meth:`set_epoch`. Save it on
      every rank (each rank's position is its own; they agree when ranks step together).

    Threads stop when an iteration ends, is abandoned (``break``, garbage collection) or
    :meth:`close` is called.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        device: str | torch.device | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        prefetch: int | None = None,
        threads: int | None = None,
        buffers: BufferMode = "checked",
        gather: GatherMode = "auto",
    ) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if buffers not in BUFFER_MODES:
            raise ValueError(f"buffers={buffers!r}: choose from {', '.join(BUFFER_MODES)}")
        if gather not in GATHER_MODES:
            raise ValueError(f"gather={gather!r}: choose from {', '.join(GATHER_MODES)}")
        if world_size is None or rank is None:
            dist_rank, dist_size = _distributed()
            world_size = dist_size if world_size is None else world_size
            rank = dist_rank if rank is None else rank
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} and world_size={world_size}: need world_size >= 1 and 0 <= rank < world_size")
        if getattr(dataset, "transform", None) is not None:
            raise ValueError(
                f"{type(dataset).__name__} has a per-sample transform, which the batch path skips: open the dataset "
                "without one and transform whole batches (readers.gpu), or use a torch DataLoader"
            )
        self.dataset = dataset
        self.source = _Source(dataset)
        self.threads = default_threads(dataset) if threads is None else int(threads)
        if self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.prefetch = 2 * self.threads if prefetch is None else int(prefetch)
        if self.prefetch < 1:
            raise ValueError(f"prefetch must be at least 1, got {prefetch}")
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.rank, self.world_size = int(rank), int(world_size)
        self.device = resolve_device(device)
        self.buffers = buffers
        self.epoch = 0
        self._progress = _Progress(0, 0)  # (epoch, batches consumed) of the latest iteration
        self._start = 0  # batches of the current epoch to skip on the next iteration (a resume)
        cuda = self.device is not None and self.device.type == "cuda"
        self._transfer = CudaTransfer(self.device) if cuda else None  # type: ignore[arg-type]
        self._gather = _device_gather(dataset, self.device, gather) if cuda else None
        if gather == "device" and not cuda:
            raise ValueError(f"gather='device' needs a CUDA device, got device={device!r}")
        shape, dtype = self.source.shape, self.source.dtype
        # in flight (prefetch) + the batch in use + the one before it (still in the loop variable)
        self._pool = _Pool(lambda: _Slot(batch_size, shape, dtype, pinned=cuda), buffers, self.prefetch + 2)
        self._iterators: "weakref.WeakSet[_LoaderIterator]" = weakref.WeakSet()

    # -- the plan ----------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration follows (shuffled per ``seed`` and epoch).

        A resume position loaded for another epoch is dropped: the next iteration is whole."""
        if int(epoch) != self.epoch:
            self._start = 0
        self.epoch = int(epoch)

    # -- resuming ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: the epoch and the batches of it consumed so far, with the settings
        that decide the plan (checked by :meth:`load_state_dict`). Plain ints and bools: JSON-safe."""
        epoch, consumed = self._progress.epoch, self._progress.batches
        if epoch != self.epoch:  # set_epoch was called after the last iteration: nothing of it consumed yet
            epoch, consumed = self.epoch, self._start
        return {
            "epoch": epoch,
            "batches": consumed,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "batch_size": self.batch_size,
            "rank": self.rank,
            "world_size": self.world_size,
            "length": self.source.length,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`): the next iteration yields the rest of
        that epoch. The plan-deciding settings must match, or a ``ValueError`` names the one that
        differs (a different world size would split the epoch differently)."""
        for key in ("seed", "shuffle", "drop_last", "batch_size", "rank", "world_size", "length"):
            mine = self.state_dict()[key]
            if key in state and state[key] != mine:
                raise ValueError(
                    f"load_state_dict: the state was saved with {key}={state[key]!r}, this loader has {key}={mine!r}; "
                    "resume with the same dataset and settings"
                )
        batches = int(state["batches"])
        if not 0 <= batches <= len(self):
            raise ValueError(f"load_state_dict: batches={batches} is outside 0..{len(self)} for this loader")
        self.epoch = int(state["epoch"])
        self._start = batches
        self._progress = _Progress(self.epoch, batches)

    def _samples_per_rank(self) -> int:
        n, w = self.source.length, self.world_size
        return n // w if self.drop_last else -(-n // w)

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        per_rank = self._samples_per_rank()
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def batch_indices(self, epoch: int | None = None) -> list[np.ndarray]:
        """The dataset indices of each batch this rank yields in ``epoch`` (default: the current one)."""
        n = self.source.length
        epoch = self.epoch if epoch is None else epoch
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(n)
        else:
            order = np.arange(n, dtype=np.int64)
        total = self._samples_per_rank() * self.world_size
        if total > n:  # pad by repeating from the start (every rank the same count)
            order = np.concatenate([order, np.resize(order, total - n)]) if n else order
        order = order[:total][self.rank :: self.world_size]
        count = len(self)
        return [order[k * self.batch_size : (k + 1) * self.batch_size] for k in range(count)]

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        start, self._start = self._start, 0  # a resume applies to one iteration
        self._progress = _Progress(self.epoch, start)
        batches = self.batch_indices()[start:]
        if self._gather is not None:
            return self._gather.iterate(batches, self._progress)
        it = _LoaderIterator(batches, self.source, self._pool, self._transfer, self.threads, self.prefetch, self._progress)
        self._iterators.add(it)
        return it

    def close(self) -> None:
        """Stop the threads of every unfinished iteration (they also stop on their own when abandoned)
        and let go of a device-gather registration."""
        for it in list(self._iterators):
            it.close()
        if self._gather is not None:
            self._gather.close()
            self._gather = None

    @property
    def gather(self) -> str:
        """Where batches are gathered: ``"device"`` (the GPU, from the page-locked blob) or ``"host"``."""
        return "device" if self._gather is not None else "host"

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def buffer_bytes(self) -> int:
        """Bytes of batch buffers this loader holds now (free ones and those of live iterations)."""
        return self._pool.free_bytes + sum(it.held_bytes for it in list(self._iterators))

    @property
    def buffers_allocated(self) -> int:
        """How many batch buffers were ever allocated (stays at ``prefetch + 1``-ish when reuse works)."""
        return self._pool.allocated

    def __repr__(self) -> str:
        return (
            f"Loader({type(self.dataset).__name__}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"seed={self.seed}, drop_last={self.drop_last}, device={self.device}, rank={self.rank}, "
            f"world_size={self.world_size}, prefetch={self.prefetch}, threads={self.threads}, buffers={self.buffers!r}, "
            f"gather={self.gather!r})"
        )


class _Progress:
    """The epoch an iteration follows and how many of its batches were handed out (shared with it)."""

    __slots__ = ("epoch", "batches")

    def __init__(self, epoch: int, batches: int) -> None:
        self.epoch, self.batches = epoch, batches


def _device_gather(dataset: Any, device: torch.device, mode: str) -> Any:
    """A :class:`~readers.device_gather.DeviceGather` for ``dataset`` on ``device``, or ``None``
    for the host path (``mode="auto"`` and not possible; ``"device"`` raises instead)."""
    if mode == "host":
        return None
    from .device_gather import DeviceGather, DeviceGatherUnavailable, host_arrays

    try:
        images, labels = host_arrays(dataset, in_memory_only=mode == "auto")
        return DeviceGather(images, labels, device)
    except DeviceGatherUnavailable as exc:
        if mode == "device":
            raise ValueError(f"gather='device': {exc}") from None
        return None


def _distributed() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _Work:
    """State shared by an iteration and its threads (the threads never see the iterator itself,
    so an abandoned iterator is garbage-collected and stops them)."""

    def __init__(self, batches: list[np.ndarray], source: _Source, transfer: CudaTransfer | None) -> None:
        self.batches = batches
        self.source = source
        self.transfer = transfer
        self.tasks: "collections.deque[tuple[int, _Slot] | None]" = collections.deque()
        self.done: dict[int, tuple[_Slot, Any]] = {}
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


class _LoaderIterator:
    """One pass over a plan of batches; owns its threads."""

    def __init__(
        self,
        batches: list[np.ndarray],
        source: _Source,
        pool: _Pool,
        transfer: CudaTransfer | None,
        threads: int,
        prefetch: int,
        progress: _Progress | None = None,
    ) -> None:
        self._work = _Work(batches, source, transfer)
        self._progress = progress
        self._pool = pool
        self._prefetch = prefetch
        self._next = 0  # next batch to yield
        self._submitted = 0  # batches handed to the threads
        self._lent: collections.deque[_Slot] = collections.deque()  # CPU batches handed out, newest last
        self._in_flight: dict[int, _Slot] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False
        for k in range(min(threads, len(batches))):
            t = threading.Thread(target=_fill_loop, args=(self._work,), name=f"packer-loader-{k}", daemon=True)
            t.start()
            self._threads.append(t)

    def __iter__(self) -> "_LoaderIterator":
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
