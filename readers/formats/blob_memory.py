"""A blob copied once into anonymous shared memory (a Linux ``memfd``), for
:class:`~readers.formats.blob.BlobStore`'s ``in_memory=True``: every DataLoader worker maps the
same pages (a forked one inherits the mapping, a spawned one receives the descriptor), so the
pixels exist once in RAM however many workers read them."""

from __future__ import annotations

import errno
import mmap
import os
import threading
import weakref
from multiprocessing.reduction import DupFd, ForkingPickler

import numpy as np

from ..machine import available_memory
from ..schema import PackedFormatError

__all__ = ["MemoryCopy", "shared_copy"]


class MemoryCopy:
    """The whole file, copied once into anonymous shared memory (a Linux ``memfd``).

    Call it for a read-only uint8 array of the file's bytes. A forked process inherits the
    mapping; ``ForkingPickler`` (what spawned DataLoader workers are started with) sends the
    memfd's descriptor, and the receiver maps the same pages; plain pickle sends the path only,
    and the receiver loads its own copy when first called.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._lock = threading.Lock()

    def __call__(self) -> np.ndarray:
        if self._map is None:
            with self._lock:
                if self._map is None:
                    self._load()
        return np.frombuffer(self._map, np.uint8)  # type: ignore[arg-type]

    def _load(self) -> None:
        if not hasattr(os, "memfd_create"):  # pragma: no cover - not Linux
            raise PackedFormatError(
                f"{self.path}: sharing an in-memory blob with workers needs Linux (memfd_create); "
                "use in_memory=False to map the file instead"
            )
        with open(self.path, "rb", buffering=0) as handle:
            size = os.fstat(handle.fileno()).st_size
            available = available_memory()
            if available is not None and size > available:  # (loading it would be killed for memory, or fail mid-way)
                raise PackedFormatError(self._no_room(f"{_amount(size)}, more than the {_amount(available)} of memory this "
                                                      "machine has available"))
            try:
                fd = os.memfd_create(f"packer-blob:{os.path.basename(self.path)}", os.MFD_CLOEXEC)
            except OSError as exc:
                raise PackedFormatError(self._no_room(f"no memory to load it into ({exc.strerror})")) from None
            try:
                os.ftruncate(fd, size)
                with mmap.mmap(fd, size, access=mmap.ACCESS_WRITE) as target:
                    view, position = memoryview(target), 0
                    while position < size:
                        got = handle.readinto(view[position : position + (64 << 20)])
                        if not got:
                            raise PackedFormatError(f"{self.path}: the file shrank while being loaded; open it again")
                        position += got
                    view.release()
                self._map = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            except BaseException as exc:
                os.close(fd)
                if isinstance(exc, OSError) and exc.errno in (errno.ENOMEM, errno.ENOSPC):  # (a ulimit, a full /dev/shm)
                    raise PackedFormatError(self._no_room(f"no memory to load it into ({exc.strerror})")) from None
                raise
        self._own(fd)

    def _no_room(self, why: str) -> str:
        return (f"{self.path}: cannot be read from memory: {why}; read it mapped, RAMDataset(path, in_memory=False) "
                "(its pages come from the page cache), or convert to LMDB or HDF5")

    def _own(self, fd: int) -> None:
        """Keep ``fd`` open while this copy lives: a ``weakref.finalize`` closes it when the copy is
        collected, or at interpreter exit before module globals are torn down (a ``__del__``
        then found ``os`` already gone)."""
        self._fd = fd
        weakref.finalize(self, os.close, fd)

    def __reduce__(self):
        return (MemoryCopy, (self.path,))

    def _reduce_shared(self):
        """ForkingPickler's reduction: the memfd travels as a descriptor, not as bytes."""
        self()  # loaded, so there is something to share
        return (_attach, (self.path, len(self._map), DupFd(self._fd)))  # type: ignore[arg-type]


def _amount(size: int) -> str:
    return f"{size / 1e9:,.1f} GB" if size >= 1e8 else f"{size / 1e6:,.1f} MB"


def _attach(path: str, size: int, dupfd) -> MemoryCopy:
    """Rebuild a :class:`MemoryCopy` in the receiving process over the sent memfd."""
    copy = MemoryCopy(path)
    copy._own(dupfd.detach())
    copy._map = mmap.mmap(copy._fd, size, access=mmap.ACCESS_READ)
    return copy


ForkingPickler.register(MemoryCopy, MemoryCopy._reduce_shared)  # our own class only, like torch's tensors

_copies: "weakref.WeakValueDictionary[tuple[int, int, int, int], MemoryCopy]" = weakref.WeakValueDictionary()
_copies_lock = threading.Lock()


def shared_copy(path: str) -> MemoryCopy:
    """The in-memory copy of ``path`` for this process: one per unchanged file, shared by stores."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _copies_lock:
        copy = _copies.get(key)
        if copy is None:
            copy = _copies[key] = MemoryCopy(path)
        return copy
