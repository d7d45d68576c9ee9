"""Tar listings for packer/sources/archives.py: by offset in an uncompressed tar (a memory map,
headers only), or in one streaming pass over a compressed one (.tar.gz, .tar.bz2, .tar.xz),
never written to disk.

A compressed tar is inflated in large blocks by the fastest inflater installed: ``zlib-ng``
(a dependency of packer; its ``zlib_ng`` module) for gzip, else Python's ``zlib``; both
give the same bytes (tests/test_archives.py checks the two). The headers are parsed here, as
for an uncompressed tar (ustar, GNU long names, pax records as Python's tarfile writes them),
and the bytes of the members ``keep`` asks for are kept. A gzip file of several members
(``cat a.gz b.gz``) is read through.
"""

from __future__ import annotations

import bz2
import lzma
import mmap
import os
import tarfile
import threading
import zlib
from dataclasses import dataclass
from queue import Full, Queue
from types import ModuleType
from typing import Callable, Generator, Iterator

from readers.formats.tar import BLOCK, read_header
from readers.schema import PackedFormatError

__all__ = ["Entry", "Listing", "list_tar", "stream_tar", "gzip_inflater", "READ_BYTES", "SPECIAL"]

#: Compressed bytes read (and inflated) per step.
READ_BYTES = 1 << 20
_ZERO_BLOCK = bytes(BLOCK)
_MAGIC = {b"\x1f\x8b": "gzip", b"BZ": "bzip2", b"\xfd7": "xz"}


#: The method of a member that is a device or a FIFO: no file to convert.
SPECIAL = "special"


@dataclass
class Entry:
    """A member as listed: stored name, where its bytes lie (``offset`` in the uncompressed tar),
    what it is (``link``; ``folder``: a directory entry, no bytes); ``data``: its bytes, when kept
    from a stream."""

    name: str
    offset: int = 0
    size: int = 0
    method: str = "stored"
    crc: int = -1
    data: bytes | None = None
    link: bool = False
    folder: bool = False


class _Names:
    """What lies between two tar headers: a pax record's or a GNU long name's path (and size) for
    the next member."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.size: int | None = None

    def header(self, block: bytes, at: int) -> tuple[str, int, bytes]:
        """``(name, stored size, type flag)`` of the header ``block`` at byte ``at``."""
        try:
            name, size, kind = read_header(block)
        except PackedFormatError as exc:
            raise tarfile.TarError(f"{exc} at byte {at}") from None
        return name, (self.size if self.size is not None and kind not in (b"x", b"L", b"g") else size), kind

    def entry(self, name: str, kind: bytes, offset: int, size: int, extension: Callable[[], bytes]) -> Entry | None:
        """The member this header describes (``None`` for an extension header, read through
        ``extension()``, or a member of a type tar does not define); a device or FIFO member
        is listed with :data:`SPECIAL` for its method (it holds no bytes)."""
        if kind == b"x":
            records = _pax(extension())
            self.name = records.get("path", self.name)
            self.size = int(records["size"]) if "size" in records else self.size
            return None
        if kind == b"L":
            self.name = extension().split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            return None
        if kind == b"g":
            return None
        name, self.name, self.size = self.name or name, None, None
        if kind == b"5" or (kind in (b"0", b"\0") and name.endswith("/")):  # a folder (old tars: a file named "x/")
            return Entry(name, offset, folder=True)
        if kind in (b"0", b"\0", b"7"):
            return Entry(name, offset, size)
        if kind in (b"1", b"2"):
            return Entry(name, link=True)
        return Entry(name, method=SPECIAL) if kind in (b"3", b"4", b"6") else None


class Listing(list):
    """A tar's members (:class:`Entry`), and whether it ended as a tar does: with its zero blocks
    (``ended``). One that just stops after a member is read, as GNU tar and Python's tarfile read
    it, but an uncompressed tar has no other check of its length: cut short at a member's end (a
    copy or download that stopped), it lists fewer members without an error."""

    ended = True


def list_tar(path: str, base: int = 0, size: int | None = None) -> Listing:
    """The members of the uncompressed tar at ``path`` (or of the one inside it at ``base``,
    ``size`` bytes long): one pass over the headers of a memory map, never the member data."""
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return Listing()
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            part = view[base : base + size if size is not None else len(view)]
            try:
                return _headers(part, base)
            finally:  # both, or the map cannot close: an error's traceback holds the slice (BufferError hid the error)
                part.release()
                view.release()


def _headers(view: memoryview, base: int) -> Listing:
    entries = Listing()
    names = _Names()
    position = 0
    entries.ended = False
    while position + BLOCK <= len(view):
        block = bytes(view[position : position + BLOCK])
        if block == _ZERO_BLOCK:
            entries.ended = True
            break
        name, size, kind = names.header(block, base + position)
        start = position + BLOCK
        if start + size + (-size % BLOCK) > len(view):  # its padding too: tarfile and GNU tar call that truncated
            raise tarfile.TarError(f"ends inside the member {name!r} (truncated)")
        entry = names.entry(name, kind, base + start, size, lambda: bytes(view[start : start + size]))
        if entry is not None:
            entries.append(entry)
        position = start + size + (-size % BLOCK)
    if not entries.ended and position < len(view):
        raise tarfile.TarError(f"ends inside a header at byte {base + position} (truncated)")
    return entries


def stream_tar(path: str, keep: Callable[[str], bool], budget: Callable[[int], None]) -> list[Entry]:
    """The members of the compressed tar ``path`` in one streaming pass; the bytes of each file
    member whose name ``keep`` accepts are kept in its ``data`` (``budget(total)`` is told the
    bytes kept so far, and raises to stop)."""
    blocks = _ahead(_inflated(path))
    try:
        return _stream_entries(_Stream(blocks), keep, budget)
    finally:
        blocks.close()


def _stream_entries(stream: _Stream, keep: Callable[[str], bool], budget: Callable[[int], None]) -> list[Entry]:
    entries: list[Entry] = []
    names = _Names()
    held = 0
    while True:
        block = stream.read(BLOCK)
        if len(block) < BLOCK or block == _ZERO_BLOCK:
            if 0 < len(block) < BLOCK:
                raise tarfile.TarError(f"ends inside a header at byte {stream.offset - len(block)} (truncated)")
            break  # a tar ends with zero blocks (or, as some tools write it, just ends)
        at = stream.offset - BLOCK
        name, size, kind = names.header(block, at)
        padded = size + (-size % BLOCK)
        entry = names.entry(name, kind, stream.offset, size, lambda: stream.exactly(size, name))
        if entry is not None and not entry.link and not entry.folder and entry.method != SPECIAL and keep(entry.name):
            entry.data = stream.exactly(size, name)
            held += size
            budget(held)
        if stream.offset < at + BLOCK + padded:
            stream.skip(at + BLOCK + padded - stream.offset, name)
        if entry is not None:
            entries.append(entry)
    return entries


def _ahead(blocks: Iterator[bytes], depth: int = 4) -> Generator[bytes, None, None]:
    """``blocks``, produced by a thread up to ``depth`` ahead: the inflater (which releases the
    GIL) runs while this thread parses headers and copies members out. Closing this generator
    stops the thread."""
    queue: Queue = Queue(depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for block in blocks:
                while not stop.is_set():
                    try:
                        queue.put(block, timeout=0.1)
                        break
                    except Full:
                        continue
                if stop.is_set():
                    return
            item: object = None
        except BaseException as exc:  # handed to the reader, raised there
            item = exc
        finally:
            getattr(blocks, "close", lambda: None)()  # the compressed file, closed in this thread
        while not stop.is_set():
            try:
                queue.put(item, timeout=0.1)
                return
            except Full:
                continue

    thread = threading.Thread(target=produce, name="packer-inflate", daemon=True)
    thread.start()
    try:
        while (block := queue.get()) is not None:
            if isinstance(block, BaseException):
                raise block
            yield block
    finally:
        stop.set()
        thread.join()


def gzip_inflater() -> ModuleType:
    """The module whose ``decompressobj`` inflates gzip: ``zlib_ng`` where installed, else ``zlib``."""
    try:
        from zlib_ng import zlib_ng
    except ImportError:
        return zlib
    return zlib_ng


def _inflated(path: str) -> Iterator[bytes]:
    """The uncompressed bytes of the gzip, bzip2 or xz file ``path``, block by block."""
    with open(path, "rb") as handle:
        kind = _MAGIC.get(handle.read(2))
        handle.seek(0)
        if kind is None:
            raise tarfile.TarError("not a gzip, bzip2 or xz compressed tar")
        inflater = gzip_inflater()
        make: Callable[[], object] = {
            "gzip": lambda: inflater.decompressobj(31), "bzip2": bz2.BZ2Decompressor, "xz": lzma.LZMADecompressor,
        }[kind]
        decompressor = make()
        damaged = (getattr(inflater, "error", zlib.error), zlib.error, OSError, lzma.LZMAError, ValueError)
        while block := handle.read(READ_BYTES):
            while block:
                try:
                    out = decompressor.decompress(block)  # type: ignore[attr-defined]
                except damaged as exc:
                    raise tarfile.TarError(f"damaged {kind} data at compressed byte {handle.tell():,} ({exc})") from None
                if out:
                    yield out
                block = b""
                if decompressor.eof:  # type: ignore[attr-defined]
                    block = decompressor.unused_data  # type: ignore[attr-defined]
                    if block.strip(b"\0"):  # another gzip member follows (zero padding is not one)
                        decompressor = make()
                    else:
                        block = b""
        if not decompressor.eof:  # type: ignore[attr-defined]
            raise EOFError("the compressed file ends early (truncated)")


class _Stream:
    """Reads exact byte counts from a sequence of blocks, counting the offset."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self.blocks, self.view, self.position, self.offset = blocks, memoryview(b""), 0, 0

    def read(self, count: int) -> bytes:
        parts = []
        while count:
            if self.position == len(self.view):
                block = next(self.blocks, None)
                if block is None:
                    break
                self.view, self.position = memoryview(block), 0
            part = self.view[self.position : self.position + count]
            parts.append(part)
            self.position += len(part)
            self.offset += len(part)
            count -= len(part)
        return b"".join(parts)

    def exactly(self, count: int, name: str) -> bytes:
        data = self.read(count)
        if len(data) != count:
            raise tarfile.TarError(f"ends inside the member {name!r} (truncated)")
        return data

    def skip(self, count: int, name: str) -> None:
        while count:
            got = len(self.read(min(count, READ_BYTES)))
            if not got:
                raise tarfile.TarError(f"ends inside the member {name!r} (truncated)")
            count -= got


def _pax(data: bytes) -> dict[str, str]:
    """The ``key=value`` records of a pax header (``"%d %s=%s\\n"``)."""
    records = {}
    position = 0
    while position < len(data):
        length, _, rest = data[position:].partition(b" ")
        if not length.isdigit() or int(length) == 0:
            break
        record = data[position + len(length) + 1 : position + int(length) - 1]
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        position += int(length)
    return records
