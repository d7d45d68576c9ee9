"""The shared-memory side of the conversion pool's result transport (``packer.parallel``,
``transport="shm"``; issue 16, item 1).

Each worker has two result slots in one block the parent creates, reserves, reuses for the pool's
lifetime and unlinks (:class:`ResultSlots`): a worker killed mid-chunk leaves nothing behind. A
worker encodes its chunk's results with :func:`encode_results`, which moves each large byte
string (an encoded sample's payload) into the chunk's slot and leaves only ``(offset, size)`` in
the pickle; the parent's :func:`decode_results` copies each back out once, as its own ``bytes``
(writers keep references to payloads until they flush, and the slot is reused).
"""

from __future__ import annotations

import copy
import errno
import logging
import os
import secrets
from multiprocessing.reduction import ForkingPickler  # multiprocessing's own message encoding: between our processes only, never in a file
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any

log = logging.getLogger("packer")

__all__ = ["ResultSlots", "attach_slots", "detach_slots", "encode_results", "decode_results", "pid_namespace", "SLOT_BYTES"]

#: Byte strings of at least this size in a result go through the slots.
SHARED_MIN_BYTES = 4 << 10
#: Each worker has two result slots (its running chunk's and the one queued behind it) of this
#: size in one block the parent creates, reserves (``posix_fallocate``: a full /dev/shm fails
#: here, not as SIGBUS in a worker), reuses for the pool's lifetime and unlinks. Byte strings
#: that do not fit a chunk's slot travel in the pickle.
SLOT_BYTES = 8 << 20
#: Blocks are named ``packer-<pid namespace>-<parent pid>-<random>``: a parent killed with its
#: resource tracker (SIGKILL to the process group) cannot unlink them, so a later pool unlinks
#: those of dead pids in its own pid namespace (a container sharing /dev/shm has other pids).
BLOCK_PREFIX = "packer-"
SHM_DIR = "/dev/shm"  # where Linux lists POSIX shared memory (elsewhere: no sweep)


class ResultSlots:
    """One worker's result slots in shared memory: created, read and unlinked by the parent only,
    so a worker killed mid-chunk leaves nothing behind; a replacement worker reuses them."""

    def __init__(self) -> None:
        name = f"{BLOCK_PREFIX}{pid_namespace()}-{os.getpid()}-{secrets.token_hex(6)}"
        self.block = SharedMemory(name, create=True, size=2 * SLOT_BYTES)
        try:
            os.posix_fallocate(self.block._fd, 0, self.block.size)
        except BaseException:
            self.block.close()
            self.block.unlink()
            raise
        self.slots = [self.block.buf[i * SLOT_BYTES : (i + 1) * SLOT_BYTES] for i in range(2)]

    @staticmethod
    def create() -> "ResultSlots | None":
        """A ring, or None where shared memory is missing or full, or cannot be reserved
        (no ``posix_fallocate``: macOS): the worker then answers through the pipe."""
        if not hasattr(os, "posix_fallocate"):
            return None
        try:
            if _file_size_limit() < 2 * SLOT_BYTES:  # (SharedMemory's own failure then made the resource tracker print a KeyError)
                raise OSError(errno.EFBIG, "the file-size limit (ulimit -f) is smaller")
            return ResultSlots()
        except OSError as error:
            log.warning("results of a worker come through its pipe (slower): no %d MB of shared memory (%s); "
                        "a container needs a larger /dev/shm (docker run --shm-size)", 2 * SLOT_BYTES >> 20, error)
            return None

    @property
    def name(self) -> str:
        return self.block.name

    def close(self) -> None:
        """Unlink the block and unmap it. A view of a slot still alive (a result being copied out
        when Ctrl-C landed, kept by the traceback) keeps the mapping until it goes: that is not
        an error, and must not stop the other workers' blocks from being unlinked."""
        try:
            for view in self.slots:
                try:
                    view.release()
                except BufferError:  # exported (nothing here does): it goes with its export
                    pass
        finally:
            self.slots = []
            try:
                self.block.unlink()
            except FileNotFoundError:  # unlinked by someone else (systemd's RemoveIPC, a cleanup script): gone anyway,
                resource_tracker.unregister(self.block._name, "shared_memory")  # and not the tracker's to unlink at exit
            finally:
                _unmap(self.block)

    @staticmethod
    def sweep_orphans() -> None:
        """Unlink the blocks of pools whose parent no longer runs (Linux; elsewhere nothing)."""
        namespace = pid_namespace()
        try:
            names = os.listdir(SHM_DIR) if namespace else []
        except OSError:
            return
        ours = f"{BLOCK_PREFIX}{namespace}-"
        for name in names:
            if not name.startswith(ours):
                continue
            pid = name[len(ours):].split("-", 1)[0]
            if pid.isdigit() and not _pid_alive(int(pid)):
                try:
                    os.unlink(os.path.join(SHM_DIR, name))
                except OSError:
                    pass


def pid_namespace() -> str:
    """This process's pid namespace (Linux), or "" where it cannot be told."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def encode_results(message: tuple[str, list], slot: memoryview | None) -> bytes | memoryview:
    """A worker's ``(kind, values)``: with a ``slot``, each large byte string among ``values`` (a
    value itself, or an attribute of one, such as an encoded sample's payload) is copied into the
    slot while it has room and left empty in the pickled copy, which records where it went; the
    values themselves are not changed. Without a slot: the whole message through the pipe."""
    if slot is None:
        return ForkingPickler.dumps(message, -1)
    kind, values = message
    sent, moved, used = list(values), [], 0
    for i, value in enumerate(values):
        fields = [("", value)] if type(value) is bytes else [(k, v) for k, v in getattr(value, "__dict__", {}).items() if type(v) is bytes]
        for name, data in fields:
            end = used + len(data)
            if len(data) < SHARED_MIN_BYTES or end > len(slot):
                continue  # small, or no room left: in the pickle
            slot[used:end] = data
            moved.append((i, name, used, len(data)))
            used = end
            if not name:
                sent[i] = None
            else:
                if sent[i] is value:
                    sent[i] = copy.copy(value)  # the worker's own result stays whole
                object.__setattr__(sent[i], name, b"")
    return ForkingPickler.dumps((kind, sent, moved), -1)


def decode_results(message: bytes, slot: memoryview | None) -> tuple[str, Any]:
    """The parent's side of :func:`encode_results`: each byte string in the slot is put back as
    its own ``bytes``, copied once (writers keep references to payloads until they flush, and
    the slot is reused)."""
    decoded = ForkingPickler.loads(message)
    if len(decoded) == 2:  # through the pipe whole (no slot, or an error report)
        return decoded
    kind, values, moved = decoded
    if moved and slot is None:
        raise RuntimeError("a result refers to shared memory, but this worker has none")
    for i, name, offset, size in moved:
        data = bytes(slot[offset : offset + size])
        if name:
            object.__setattr__(values[i], name, data)
        else:
            values[i] = data
    return kind, values


def attach_slots(name: str | None) -> tuple[SharedMemory | None, list[memoryview | None]]:
    """A worker's two slots in the parent's block ``name`` (it outlives the worker and is
    unlinked by the parent) and the block, to :func:`detach_slots` when the worker ends; or no
    slots (results through the pipe) where there is none."""
    if name is None:
        return None, [None, None]
    try:
        block = SharedMemory(name)
    except (OSError, ValueError):  # gone (unlinked by someone else): results go through the pipe
        return None, [None, None]
    return block, [block.buf[i * SLOT_BYTES : (i + 1) * SLOT_BYTES] for i in range(2)]


def detach_slots(block: SharedMemory | None, slots: list[memoryview | None]) -> None:
    """Release the slot views, then the worker's mapping of the block (never unlinked here)."""
    for view in slots:
        if view is not None:
            view.release()
    if block is not None:
        _unmap(block)


def _unmap(block: SharedMemory) -> None:
    """Close this process's mapping of ``block``. A view of it still alive keeps the map until
    it goes: not an error (the SharedMemory lets go of the map now, or its ``__del__`` would
    raise the same error again, printed as an ignored exception)."""
    try:
        block.close()
    except BufferError:
        block._buf = block._mmap = None  # (stdlib internals, as for _fd above: no public way)
        block.close()  # its descriptor


def _file_size_limit() -> float:
    """This process's limit on a file's size in bytes (``RLIMIT_FSIZE``), infinite where there is none."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return float("inf")
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return float("inf") if soft == resource.RLIM_INFINITY else soft
