"""Reading the tar bytes of WebDataset shards: the one ustar header parser.

Two ways over a shard, one header parser (:func:`read_header`): :func:`iter_tar` streams the
members of a file or pipe (``readers.StreamingShards``); :func:`tar_members` walks an in-memory
or mapped shard and says where each member's data lies (``ShardStore.structure_faults``, which
``packer verify`` reports). The layout of the shards themselves (member names, the index) is
``readers/formats/webdataset.py``'s; :func:`tar_header` writes the headers its writer puts before each member.
"""

from __future__ import annotations

import tarfile
from typing import BinaryIO, Iterator

import numpy as np

from ..schema import PackedFormatError

__all__ = ["BLOCK", "read_header", "tar_header", "tar_members", "iter_tar"]

#: Tar headers and member data come in blocks of this many bytes.
BLOCK = 512


#: The fixed fields of :func:`tar_header` after the name (mode 0644, uid and gid 0) and after
#: the checksum (a regular file, no link, ustar magic and version 00, no owner, no device numbers,
#: no prefix), as ``tarfile`` writes them.
_TAR_MODE_IDS = b"0000644\x00" + b"0000000\x00" * 2
_TAR_REST = b"0" + bytes(100) + b"ustar\x0000" + bytes(32 + 32 + 8 + 8 + 155 + 12)
#: The checksum adds the header's bytes with its own field as 8 spaces.
_TAR_FIXED_SUM = sum(_TAR_MODE_IDS) + sum(b"00000000000\x00") + 8 * ord(" ") + sum(_TAR_REST)


def tar_header(name: str, size: int) -> bytes:
    """The 512-byte ustar header of a regular file (mode 0644, mtime 0, no owner): deterministic.

    Byte for byte what ``tarfile`` writes (``TarInfo.tobuf(USTAR_FORMAT)``), built directly for
    ASCII names of at most 100 bytes (every sample's): ``tarfile``'s general path is slower, and
    it runs twice per sample in every WebDataset worker. Other names go through ``tarfile``."""
    raw = name.encode("ascii", "strict")
    if len(raw) <= 100 and 0 <= size < 8**11:
        size_field = b"%011o\x00" % size
        checksum = _TAR_FIXED_SUM + sum(raw) + sum(size_field)
        return b"".join((raw, bytes(100 - len(raw)), _TAR_MODE_IDS, size_field, b"00000000000\x00", b"%06o\x00 " % checksum, _TAR_REST))
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.USTAR_FORMAT, "ascii", "strict")


def read_header(block: bytes) -> tuple[str, int, bytes]:
    """``(name, size, type flag)`` of one 512-byte ustar header; :class:`PackedFormatError`
    saying what is wrong when it does not parse or its checksum disagrees (the caller names
    the file and the position)."""
    try:
        size = tarfile.nti(block[124:136])
        stored = tarfile.nti(block[148:156])
    except tarfile.InvalidHeaderError:
        raise PackedFormatError("damaged tar header") from None
    if stored not in tarfile.calc_chksums(block):
        raise PackedFormatError("damaged tar header (bad header checksum)")
    name = block[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
    prefix = block[345:500].split(b"\0", 1)[0].decode("utf-8", "replace")
    return (f"{prefix}/{name}" if prefix else name), size, block[156:157]


def tar_members(data: bytes | memoryview) -> Iterator[tuple[str, int, int]]:
    """``(name, data offset, size)`` of each member of the tar held in ``data``, up to its end
    (a zero block). A damaged header or a tar that ends inside a member raises
    :class:`PackedFormatError` saying which byte (the caller names the file)."""
    view = memoryview(data)
    position = 0
    while position + BLOCK <= len(view):
        block = bytes(view[position : position + BLOCK])
        if not any(block):
            return
        try:
            name, size, _kind = read_header(block)
        except PackedFormatError as exc:
            raise PackedFormatError(f"{exc} at byte {position}") from None
        if position + BLOCK + size > len(view):
            break
        yield name, position + BLOCK, size
        position += BLOCK + size + (-size % BLOCK)
    raise PackedFormatError("ends inside a tar member (truncated)")


def iter_tar(stream: BinaryIO, where: str) -> Iterator[tuple[str, np.ndarray]]:
    """``(member name, data)`` of each regular file of a tar stream, data in a fresh uint8 array.

    A minimal ustar reader for packer's own shards (and any plain tar without long names):
    headers are parsed directly, so a member costs one read of its bytes. A truncated stream
    or a damaged header raises :class:`PackedFormatError` naming ``where``.
    """
    readinto = getattr(stream, "readinto", None)
    while True:
        header = _read_exact(stream, readinto, BLOCK, where, allow_eof=True)
        if header is None or not header.any():
            return  # end of archive (zero block) or of the stream
        try:
            name, size, kind = read_header(header.tobytes())
        except PackedFormatError as exc:
            raise PackedFormatError(f"{where}: {exc}") from None
        data = _read_exact(stream, readinto, size, where)
        padding = -size % BLOCK
        if padding:
            _read_exact(stream, readinto, padding, where)
        if kind in (b"0", b"\0"):
            yield name, data  # type: ignore[misc]


def _read_exact(stream: BinaryIO, readinto, size: int, where: str, allow_eof: bool = False) -> np.ndarray | None:
    out = np.empty(size, np.uint8)
    view = memoryview(out)
    done = 0
    while done < size:
        if readinto is not None:
            n = readinto(view[done:])
        else:
            chunk = stream.read(size - done)
            n = len(chunk)
            view[done : done + n] = chunk
        if not n:
            if allow_eof and done == 0:
                return None
            raise PackedFormatError(f"{where}: the shard is truncated (ends inside a tar member); convert again")
        done += n
    return out
