"""``Loader``: whole batches of a map-style dataset, filled ahead by threads, optionally on CUDA.

Why threads and not DataLoader worker processes: a batch of packed raw pixels needs no
decoding, only copying (an LMDB read, a numpy gather, a file read), and those release the GIL.
Worker processes must send every batch through shared memory to the training process, which
caps them (on the 2-core development VM, packed raw 224x224x3 datasets read through a
DataLoader at 5,057-6,411 images/s with 2 workers against 14,051-18,505 with none:
``benchmarks/results/full.json``, ``python -m benchmarks.run``). Threads of the training process fill preallocated batch arrays in
place instead, so one batch costs one copy out of storage and nothing else.

Pipeline: the epoch's index plan (shuffled by ``seed`` and the epoch, split between
distributed ranks: :class:`~readers.epoch.EpochPlan`) is cut into batches; ``threads`` threads
each fill a whole batch, at most ``prefetch`` batches ahead of the consumer, into a small pool of
reused buffers (:mod:`readers.filling`), through the
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

import contextlib
import os
import warnings
import weakref
from typing import Any, Iterator, Literal

import numpy as np
import torch
import torch.autograd.profiler as _profiler
from torch.profiler import record_function

from .cuda import CudaTransfer, resolve_device
from .dataset import store_of
from .device_decode import DECODE_MODES, DeviceDecode, decodable_store
from .epoch import (EpochCursor, EpochPlan, check_batch_size, dataset_fingerprint, follow_epoch, position_state, positive_number, read_position_state,
                    resolve_rank, subset_of)
from .filling import BatchSource, BufferPool, BufferSlot, FillingIterator
from .foreign_args import refuse_foreign
from .nvjpeg import require_cuda
from .passes import Pass, UntilEnded

__all__ = ["Loader", "BUFFER_MODES", "GATHER_MODES", "default_threads"]

BUFFER_MODES = ("checked", "recycle", "fresh")
BufferMode = Literal["checked", "recycle", "fresh"]
GATHER_MODES = ("auto", "host", "device")
GatherMode = Literal["auto", "host", "device"]
DecodeMode = Literal["cpu", "cuda"]

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
    store = store_of(dataset)
    if store is not None and store.serial_reads:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(_MAX_DEFAULT_THREADS, cores))


# -- the loader ------------------------------------------------------------------------------
class Loader:
    """Batches ``(images, labels)`` of a map-style dataset: uint8 ``(N, C, H, W)`` and int64 ``(N,)``.

    ``dataset`` is any packer reader (anything with ``.store`` or ``read_batch(indices, out)``;
    a path is refused: open it with ``readers.open_dataset(path)``); a plain torch Dataset of
    ``(image, integer label)`` pairs works too, slowly, through ``__getitems__``/``__getitem__``
    (a label that is no class index, a float or several values, is refused: use a DataLoader).

    * Order: a permutation drawn from ``(seed, epoch)`` when ``shuffle`` (same seed and epoch,
      same order), else index order. An iteration that runs out moves the loader on to the
      next epoch (as a ``DataLoader`` reshuffles every pass), as does one stopped at its last
      batch (a counted loop) when the next begins; one abandoned before its last batch does
      not; :meth:`set_epoch` chooses the epoch, before an iteration or during one (then the
      next iteration follows it), like ``DistributedSampler``'s.
    * Distributed: ``rank`` and ``world_size`` (default: from ``torch.distributed`` when it is
      initialised, else one process, with a warning when the environment says ``WORLD_SIZE >
      1``: create the Loader after ``init_process_group``, or pass both) give each rank every
      ``world_size``-th sample of the epoch's order. Every rank gets the same number of samples
      and batches: without ``drop_last`` the order is padded by repeating its first samples (at
      most ``world_size - 1``), and a shorter last batch is kept; with ``drop_last`` the tail
      that does not divide evenly is dropped, and so is a shorter last batch. Settings whose
      epoch has no batch (no samples, or ``drop_last`` dropping them all) are refused.
    * ``seed`` and :meth:`set_epoch`'s epoch are integers >= 0 (others raise naming them).
    * ``indices`` (as FFCV's): read only these dataset indices (any order, repeats allowed; a
      split of one file): every epoch's plan (order, ranks, resume) is over them, batches come
      through the same fast path (a ``Subset`` goes sample by sample), and a saved state is tied
      to them (a state of other indices, or of the whole dataset, is refused).
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
      page-locking the blob takes time once per process, growing with its size), and uses the host path for anything
      else; ``"device"`` insists (an error says why it cannot; a mapped blob is page-locked
      too); ``"host"`` always fills pinned buffers in threads.
    * ``decode`` (CUDA, JPEG-stored datasets): ``"cpu"`` (default) decodes in the filling
      threads; ``"cuda"`` reads the stored JPEG bytes in the threads and decodes each batch on
      the GPU with nvJPEG (``pip install 'packer[gpu]'``; :mod:`readers.device_decode`), same
      uint8 ``(N, C, H, W)`` contract. Refused for raw datasets (nothing to decode).

    * Resume (elastic, exact): every epoch has one global order, read in steps of
      ``batch_size * world_size`` samples split across ranks (:class:`~readers.epoch.EpochPlan`).
      :meth:`state_dict` is rank-independent and JSON-safe: ``{epoch, samples_consumed, seed,
      shuffle, dataset}``. A Loader over the same dataset (checked by its fingerprint) given it
      by :meth:`load_state_dict` yields, over all its ranks, each sample of the epoch's rest
      exactly once (plus the padding of a short last step, or minus the dropped tail with
      ``drop_last``), with any ``world_size``, ``batch_size``, ``threads`` or device; the next
      epochs (:meth:`set_epoch`) are those of an uninterrupted run with the new settings. The
      rest is cut into steps of the new ``batch_size * world_size``, so the number of steps left
      is ``ceil(rest / (batch_size * world_size))`` (``floor`` with ``drop_last``), which is
      what ``len()`` reports from the load until the resumed iteration ends. All ranks
      hold the same state when they step together: saving rank 0's is enough.

    Threads stop when an iteration ends, is abandoned (``break``, garbage collection) or
    :meth:`close` is called.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> "Loader":
        # a DataLoader's or FFCV's argument (num_workers=, pin_memory=...): refused naming the Loader's own,
        # before Python's plain "unexpected keyword argument"; __init__ keeps its signature
        refuse_foreign(kwargs, cls.__name__)
        return super().__new__(cls)

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
        decode: DecodeMode = "cpu",
        indices: Any = None,
    ) -> None:
        batch_size = check_batch_size(batch_size)
        _check_dataset(dataset)
        if decode not in DECODE_MODES:
            raise ValueError(f"decode={decode!r}: choose from {', '.join(DECODE_MODES)}")
        if decode == "cuda":
            decodable_store(dataset)  # raw, png or text: refused before anything else
            if gather == "device":
                raise ValueError("gather='device' gathers stored raw pixels; decode='cuda' decodes JPEG batches on the GPU: drop one of them")
            cuda_asked = False
            with contextlib.suppress(RuntimeError, TypeError):  # (a device torch does not know: said below)
                cuda_asked = device is not None and torch.device(device).type == "cuda"
            if cuda_asked:  # no CUDA here: GPUDecodeUnavailable, what a CPU fallback catches
                require_cuda(device, "Loader(decode='cuda')")
        if buffers not in BUFFER_MODES:
            raise ValueError(f"buffers={buffers!r}: choose from {', '.join(BUFFER_MODES)}")
        if gather not in GATHER_MODES:
            raise ValueError(f"gather={gather!r}: choose from {', '.join(GATHER_MODES)}")
        rank, world_size = resolve_rank(rank, world_size, "Loader")
        if getattr(dataset, "transform", None) is not None:
            raise ValueError(
                f"{type(dataset).__name__} has a per-sample transform, which the batch path skips: open the dataset "
                "without one and transform whole batches (readers.gpu), or use a torch DataLoader"
            )
        self.dataset = dataset
        self.source = _ProfiledSource(dataset)
        self.threads = default_threads(dataset) if threads is None else positive_number(threads, "threads")
        self.prefetch = 2 * self.threads if prefetch is None else positive_number(prefetch, "prefetch")
        self.indices, subset = subset_of(indices, self.source.length, "Loader") if indices is not None else (None, "")
        length = self.source.length if self.indices is None else len(self.indices)
        self.plan = EpochPlan(length, batch_size, shuffle, seed, drop_last, rank, world_size)
        self.plan.refuse_empty("Loader")
        self._fingerprint = dataset_fingerprint(dataset, length) | ({"subset": subset} if subset else {})
        self.device = resolve_device(device)
        self.buffers = buffers
        # the epoch of the next iteration, and the position it starts from (a resume; None: whole)
        self._cursor = EpochCursor()
        self._progress = Pass(0, 0)  # the latest iteration: its epoch, start, batches handed out, whether it ended
        cuda = self.device is not None and self.device.type == "cuda"
        self._transfer = _ProfiledTransfer(self.device) if cuda else None  # type: ignore[arg-type]
        self._gather = _device_gather(dataset, self.device, gather) if cuda and decode == "cpu" else None
        if decode == "cuda" and not cuda:
            raise ValueError(f"decode='cuda' decodes on the GPU: pass device='cuda' too, got device={device!r}")
        self._decode = DeviceDecode(dataset, self.device, threads=self.threads, prefetch=self.prefetch) if decode == "cuda" else None  # type: ignore[arg-type]
        if gather == "device" and not cuda:
            raise ValueError(f"gather='device' needs a CUDA device, got device={device!r}")
        shape, dtype = self.source.shape, self.source.dtype
        # in flight (prefetch) + the batch in use + the one before it (still in the loop variable)
        self._pool = BufferPool(lambda: BufferSlot(batch_size, shape, dtype, pinned=cuda), buffers, self.prefetch + 2)
        self._iterators: "weakref.WeakSet[FillingIterator]" = weakref.WeakSet()

    # -- the plan (readers/epoch.py) ---------------------------------------------------------
    batch_size = property(lambda self: self.plan.batch_size, doc="Samples per batch.")
    shuffle = property(lambda self: self.plan.shuffle, doc="Whether each epoch's order is a permutation.")
    seed = property(lambda self: self.plan.seed, doc="The seed of every epoch's permutation.")
    drop_last = property(lambda self: self.plan.drop_last, doc="Whether the uneven tail and a short last batch are dropped.")
    rank = property(lambda self: self.plan.rank, doc="This process's rank.")
    world_size = property(lambda self: self.plan.world_size, doc="How many ranks share each epoch.")

    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration follows (from a pass's last batch on, the
        next epoch: as :meth:`state_dict` and ``len()`` say)."""
        return self._cursor.epoch + 1 if self._progress.moving_on() else self._cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration follows (shuffled per ``seed`` and epoch;
        without it, each iteration that runs out moves on to the next epoch).

        A resume position loaded for another epoch is dropped: the next iteration is whole."""
        self._cursor.set_epoch(epoch)
        self._progress.moved_on = True  # chosen: the last pass does not move it on

    # -- resuming ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the job is in the epoch: ``{epoch, samples_consumed, seed, shuffle, dataset}``
        (``samples_consumed``: positions of the epoch's global order read by all ranks together;
        ``dataset``: the fingerprint :meth:`load_state_dict` checks; from an iteration's last
        batch on: the next epoch, nothing of it consumed, as :meth:`__len__` counts it, so a
        checkpoint saved at an epoch's last step resumes with the next one). Plain values: JSON-safe.

        After a loop that broke off mid-epoch the state holds the samples read so far (what a
        checkpoint at pre-emption needs), while the next ``for`` over this loader starts the epoch
        again, as :meth:`__len__` says (an abandoned pass does not move on): to carry on in the
        same process instead, ``loader.load_state_dict(loader.state_dict())`` first."""
        latest = self._progress
        epoch, consumed = latest.epoch, self.plan.position(latest.start, latest.batches)
        if epoch != self.epoch:  # moved on (set_epoch, the last iteration ran out or handed out its last batch): nothing of it consumed yet
            epoch, consumed = self.epoch, self._cursor.position or 0
        return position_state(self.plan, epoch, consumed, self._fingerprint)

    @contextlib.contextmanager
    def unchanged(self) -> Iterator[None]:
        """Iterations inside leave the loader as they found it: its epoch, resume position and
        latest pass (an iteration of the user's still open goes on as if nothing had run).
        ``readers.diagnose`` times a Loader this way."""
        saved = (self._cursor.epoch, self._cursor.position, self._progress, self._progress.moved_on)
        try:
            yield
        finally:
            self._cursor.epoch, self._cursor.position, self._progress, self._progress.moved_on = saved

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`, saved with any world size, batch size
        and thread count): the next iteration yields the rest of that epoch. A state of another
        dataset (its fingerprint), with another ``seed`` or ``shuffle``, or that is not a loader
        state raises :class:`~readers.epoch.ResumeError` naming what differs. A state of the
        format before the global plan (``batches`` per rank) is converted exactly."""
        epoch, consumed = read_position_state(state, self.plan, self._fingerprint, "loader")
        self._cursor.resume(epoch, consumed)
        self._progress = Pass(epoch, consumed)

    def __len__(self) -> int:
        """Batches of this epoch's pass on this rank (the same on every rank): what the next
        iteration yields, and while an iteration is under way (until it has handed out its last
        batch) what it yields; from its last batch on, what the next iteration yields (the
        next epoch's, whole: a counted loop, ``zip(range(len(loader)), loader)``, never sees the
        iterator run out).

        The whole epoch's batches, except after :meth:`load_state_dict` mid-epoch: then the rest
        of that epoch (``ceil(rest / (batch_size * world_size))``, ``floor`` with ``drop_last``),
        before and during the resumed iteration, until its last batch, :meth:`set_epoch` moves
        to another epoch, or a loop over it breaks off (its iterator dropped: the next iteration
        starts the epoch again, whole, as ``len`` then says). ``len(ResumableSampler)`` is the same before an iteration (in samples); it
        cannot see the end of a DataLoader's loop, so it reports the next, whole pass during it."""
        if self._cursor.position is not None:  # a loaded position, not iterated yet
            return self.plan.steps(self._cursor.position)
        latest = self._progress
        if latest.epoch == self.epoch and latest.under_way():  # a (resumed) iteration short of its last batch, not abandoned
            return self.plan.steps(latest.start)
        return len(self.plan)

    def batch_indices(self, epoch: int | None = None, start: int = 0) -> list[np.ndarray]:
        """The dataset indices of each batch this rank yields in ``epoch`` (default: the current
        one) from position ``start`` (default: the whole epoch)."""
        batches = self.plan.batches(self.epoch if epoch is None else epoch, start)
        return batches if self.indices is None else [self.indices[batch] for batch in batches]

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        last = self._progress
        last.move_on()  # the last pass handed out every batch, its iterator not run out (Pass)
        start, self._cursor.position = self._cursor.position or 0, None  # a resume applies to one iteration
        batches = self.batch_indices(start=start)
        restarts = last.restarts + 1 if last.cut_short() and last.epoch == self.epoch and start == 0 else 0
        self._progress = progress = Pass(self.epoch, start, self._cursor, len(batches), restarts)
        if restarts == 2:  # (once: a look at one batch and then the epoch is no repeat)
            warnings.warn(f"Loader: epoch {self.epoch} begins again at its first batch, a third time: the passes before "
                          f"stopped after {last.batches} of {last.total} batches, and only a pass that hands out every batch "
                          "moves on to the next epoch, so each reads the same first batches; call loader.set_epoch(epoch) "
                          "before each epoch (as with DistributedSampler), or keep one iterator and draw from it", stacklevel=2)
        follow_epoch(self.dataset, self.epoch)
        if self._gather is not None:
            return progress.follow(UntilEnded(self._gather.iterate(batches, progress), progress))
        if self._decode is not None:
            return progress.follow(UntilEnded(self._decode.iterate(batches, progress), progress))
        it = _ProfiledIterator(batches, self.source, self._pool, self._transfer, self.threads, self.prefetch, progress=progress)
        self._iterators.add(it)
        return progress.follow(it)

    def close(self) -> None:
        """Stop the threads of every unfinished iteration (they also stop on their own when abandoned)
        and let go of a device-gather registration."""
        for it in list(self._iterators):
            it.close()
        if self._decode is not None:
            self._decode.close()
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
            f"gather={self.gather!r}{'' if self.indices is None else f', indices=<{len(self.indices)}>'})"
        )


# -- torch.profiler ranges of the stages (readers.diagnose(trace=...), packer doctor --trace) --
def _stage(name: str) -> Any:
    """A profiler range while a torch profiler runs; nothing otherwise (an idle ``record_function``
    still makes a dispatcher call). With or without: within noise, benchmarks/results/loader_ranges.json
    (``python -m benchmarks.loader_ranges --update-results --rounds 20``)."""
    return record_function(name) if getattr(_profiler, "_is_profiler_enabled", True) else contextlib.nullcontext()


class _ProfiledSource(BatchSource):
    def fill(self, indices: np.ndarray, out: np.ndarray, labels: np.ndarray) -> None:
        with _stage("packer.loader.fill"):
            super().fill(indices, out, labels)


class _ProfiledTransfer(CudaTransfer):
    def issue(self, tensors: Any) -> Any:
        with _stage("packer.loader.copy_to_device"):
            return super().issue(tensors)


class _ProfiledIterator(FillingIterator):
    def __init__(self, *args: Any, progress: Pass) -> None:
        super().__init__(*args, progress=progress)
        self._pass = progress

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        with _stage("packer.loader.wait"):
            try:
                return super().__next__()
            except StopIteration:
                self._pass.end()
                raise


def _check_dataset(dataset: Any) -> None:
    """Refuse, in one line, what is not a map-style dataset (a path above all: open it first)."""
    if isinstance(dataset, (str, bytes, os.PathLike)):
        raise TypeError(f"Loader takes a dataset, not a path: got {dataset!r}; open it first, e.g. "
                        f"Loader(readers.open_dataset({os.fsdecode(dataset)!r}), batch_size)")
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__") or not any(
            hasattr(dataset, a) for a in ("store", "read_batch", "__getitem__")):
        raise TypeError(f"Loader takes a map-style dataset (len() and dataset[i], or a packer reader such as "
                        f"readers.open_dataset(path)), got {type(dataset).__name__}; stream an IterableDataset with a torch DataLoader")


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
