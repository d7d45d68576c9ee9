"""Samples the conversion workers write into the output themselves (issue 16: no single-process ceiling).

A fixed-shape raw output has a known place for input ``i``'s sample, as long as no earlier input
was skipped: ``base + i * stride`` in a blob (samples back to back: ``packer/writers/blob.py``),
the file offset of row ``i``'s chunk in HDF5 (one chunk per sample, all of them allocated when
the dataset is created: ``packer/writers/hdf5.py``). While that holds, each worker writes its samples there
itself (``os.pwrite``, from the worker's own descriptor of ``DST.partial``) and sends back only a
:class:`Placed` record (label, shape, size, checksum); the driving process books it without
touching its bytes. The driver still takes the checkpoints (an ``fsync`` makes the workers'
writes durable as well as its own: they are one file) and writes everything but the samples.
Each worker writes its samples to disk as it goes and drops them from the page cache
(``files.WriteBehind.wrote_range``, the step chosen by the driver): nothing reads them while the
conversion runs but the few moved down after a skipped input (below; read back from the disk,
once per conversion), and the next samples reuse the memory just freed.

The first skipped input ends it: from then on the driver asks the workers for the samples
(:meth:`Placement.stop`; chunks are handed out in input order, so every chunk handed out later
is not placed) and writes them at the next sample's place itself; the few samples the workers
had already placed after the skip are moved down to their place by the writer (:meth:`Placed`
with ``index`` above the sample count). So the output is byte-identical to the one the driver
alone writes, for any worker count (the blob is cut after its last sample; HDF5 empties and
cuts the rows nobody took); ``--resume`` sees an ordinary checkpoint (samples back to back up
to it).

A worker holds a shared ``flock`` on ``DST.partial`` for as long as it may write into it (from
before it converts the first input it may place). The
pool kills and joins its workers whenever the driver stops, but a driver killed outright
(SIGKILL, the OOM killer) leaves them running: they finish what they were handed, writing into
the file, and only then find the driver gone. So a resumed run first waits, with an exclusive
lock, until no such worker holds the file (:func:`wait_for_writers`), before it cuts the file
back to its checkpoint and goes on.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple, Protocol, Sequence, runtime_checkable

from .errors import OutputError
from . import files
from .files import WriteBehind
from .preprocess.task import Encoded, Failed
from .work_unit import WorkUnit, needs_main

__all__ = ["PlaceEntry", "Placed", "Placement", "PlacingWriter", "PlaceTask", "pwrite_all", "wait_for_writers", "WRITERS_WAIT_SECONDS"]

#: How long a resumed run waits for the workers of a killed run to stop writing into its output.
WRITERS_WAIT_SECONDS = 60.0


@dataclass(frozen=True)
class Placed:
    """A sample a worker wrote at input ``index``'s place in the output: what the writer books.
    ``error``: ``(errno, message)`` when the write failed (a full disk): the driver reports it."""

    index: int
    label: int
    shape: tuple[int, int, int]
    nbytes: int
    checksum: int
    decoder_messages: str = ""
    error: tuple[int, str] | None = None


@runtime_checkable
class PlacingWriter(Protocol):
    """A writer whose samples workers may write themselves (the driver checks ``isinstance``)."""

    def placement(self, shape: tuple[int, int, int], first_input: int, inputs: int) -> "Placement | None":
        """Where input ``i`` (of the ``inputs`` from ``first_input`` on) goes, for samples of
        ``shape``; ``None`` when this output cannot be written by other processes (a sink,
        samples already skipped)."""
        ...


@dataclass
class Placement:
    """The output file and where input ``i``'s sample of ``stride`` bytes goes (:meth:`offset`:
    ``starts[i]`` when given, else ``base + i * stride``); :attr:`placing` until the first
    skipped input (:meth:`stop`)."""

    path: str
    base: int
    stride: int
    shape: tuple[int, int, int]
    starts: Sequence[int] | None = None
    placing: bool = True

    def offset(self, index: int) -> int:
        """The file offset of input ``index``'s place."""
        return int(self.starts[index]) if self.starts is not None else self.base + index * self.stride

    def stop(self) -> None:
        """No more placing: chunks handed out from now on bring their samples back."""
        self.placing = False

    def moved(self, fd: int, sample: Placed, index: int) -> bytes | None:
        """What the writer does with a worker's record, booked as sample ``index``: raise the
        worker's write error; ``None`` when the sample is at its place; else (inputs before it
        were skipped) its bytes, read back from ``fd`` to be written at sample ``index``'s place
        (few: placing stops here, if the driver had not stopped it at the skip already)."""
        if sample.error is not None:
            raise OSError(*sample.error)
        if sample.index == index:
            return None
        self.stop()
        data = os.pread(fd, sample.nbytes, self.offset(sample.index))
        if len(data) != sample.nbytes:
            raise OSError(0, "a worker's sample is missing from the output")
        return data

    def task(self, task: Callable[[Any], Encoded | Failed]) -> "PlaceTask":
        """The work unit that runs ``task`` and places its sample (a picklable object)."""
        return PlaceTask(task, self.path, self.stride, self.shape, files.WRITE_BEHIND_STEP)  # (looked up now: tests shrink it)

    def items(self, items: Sequence[Any], first: int) -> Sequence[PlaceEntry]:
        """``items`` (input ``first`` on) as ``(index, item, offset)``, ``offset`` the place to
        write the sample at, or ``None`` once placing stopped (read when a chunk is handed out)."""
        return _Entries(items, first, self)


class PlaceEntry(NamedTuple):
    """What a :class:`PlaceTask` is given per input: its sample index, the input, and where its
    sample goes in the file (``None``: not placed, the driver writes it)."""

    index: int
    item: Any
    offset: int | None


class _Entries(Sequence):
    """A :class:`PlaceEntry` for each item; slicing (how the pool hands out a chunk)
    reads :attr:`Placement.placing` at that moment."""

    def __init__(self, items: Sequence[Any], first: int, placement: Placement) -> None:
        self._items, self._first, self._placement = items, first, placement

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, where: Any) -> Any:
        placement = self._placement
        at = placement.offset if placement.placing else lambda index: None
        if isinstance(where, slice):
            return [PlaceEntry(self._first + i, self._items[i], at(self._first + i)) for i in range(*where.indices(len(self._items)))]
        index = range(len(self._items))[where]
        return PlaceEntry(self._first + index, self._items[index], at(self._first + index))


class PlaceTask(WorkUnit):
    """Run the conversion task; write a fixed-shape sample at its input's place, or return it."""

    def __init__(self, task: Callable[[Any], Encoded | Failed], path: str, stride: int, shape: tuple[int, int, int],
                 behind_step: int | None = None) -> None:
        self.task, self.path, self.stride, self.shape = task, path, stride, shape
        #: A worker writes its samples to disk as it goes, this many bytes at a time (``None``:
        #: files.WRITE_BEHIND_STEP): :meth:`files.WriteBehind.wrote_range`.
        self.behind_step = behind_step
        self.needs_main = needs_main(task)  # passed on (packer/work_unit.py)
        self._fd = -1
        self._behind: WriteBehind | None = None
        self._driver = os.getpid()  # run here (a single input), the descriptor is not kept open

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": -1, "_behind": None}  # each process opens the file for itself

    def __call__(self, entry: PlaceEntry) -> Encoded | Failed | Placed:
        index, item, offset = entry
        if offset is not None:
            self._hold()
        return self._place(index, self.task(item), offset)

    def map(self, entries: Sequence[PlaceEntry]) -> Iterator[Encoded | Failed | Placed]:
        """As ``__call__`` for each entry, through the task's own ``map`` where it has one (remote
        inputs read ahead: packer/preprocess/task.py)."""
        from .pool_worker import run_items  # the pool's rule for a work unit's map

        if any(entry.offset is not None for entry in entries):
            self._hold()
        for (index, _item, offset), result in zip(entries, run_items(self.task, [entry.item for entry in entries])):
            yield self._place(index, result, offset)

    def _hold(self) -> None:
        """Open the file and take the shared lock before converting anything this process may
        write (not at the first write: a killed driver's worker still converting its first input
        must be waited for too, :func:`wait_for_writers`). An error here is left to :meth:`_place`,
        which opens the file again and reports it with the sample."""
        if self._fd < 0 and os.getpid() != self._driver:
            try:
                self._open_locked()
            except OSError:
                pass

    def _open_locked(self) -> None:
        """Open the file and take the shared lock, held until this process ends (module doc)."""
        fd = os.open(self.path, os.O_WRONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        if os.getpid() != self._driver:
            self._behind = WriteBehind(fd, self.behind_step)  # (the output is not read while it is written)

    def _place(self, index: int, result: Encoded | Failed, offset: int | None) -> Encoded | Failed | Placed:
        """Write ``result`` at ``offset`` (input ``index``'s place) and return its record; a
        failure, or a sample not to be placed (``offset`` None), is returned as it is."""
        if offset is None or not isinstance(result, Encoded):
            return result
        if result.shape != self.shape or len(result.payload) != self.stride:  # pragma: no cover - fixed-shape jobs only
            raise ValueError(f"internal error: a sample of shape {result.shape} in an output of {self.shape}")
        placed = Placed(index, result.label, result.shape, self.stride, result.checksum, result.decoder_messages)
        try:
            if self._fd < 0:
                self._open_locked()
            pwrite_all(self._fd, result.payload, offset)
            if self._behind is not None:
                self._behind.wrote_range(offset, offset + self.stride)
        except OSError as exc:
            return dataclasses.replace(placed, error=(exc.errno or errno.EIO, exc.strerror or str(exc)))
        finally:
            if os.getpid() == self._driver and self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        return placed


def wait_for_writers(fd: int, what: str) -> None:
    """Wait until no worker of an earlier run holds ``fd``'s file (their shared locks), up to
    :data:`WRITERS_WAIT_SECONDS`; then raise :class:`OutputError` saying why the resume cannot go
    on (not an ``OSError``: the writer would drop the partial output, and its checkpoint is good)."""
    deadline = time.monotonic() + WRITERS_WAIT_SECONDS
    warned = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise OutputError(f"{what}: worker processes of the interrupted conversion are still writing into it after "
                                  f"{WRITERS_WAIT_SECONDS:g} s; end them (the killed run's packer processes), then --resume again") from None
            if not warned:
                logging.getLogger("packer").warning("waiting for the worker processes of the interrupted conversion to stop writing into %s", what)
                warned = True
            time.sleep(0.05)
            continue
        fcntl.flock(fd, fcntl.LOCK_UN)
        return


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``os.pwrite`` may write less)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
