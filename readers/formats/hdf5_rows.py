"""Raw fixed-layout HDF5 samples read without h5py (``readers/formats/hdf5.py``): where each
one-sample chunk starts in the file, from HDF5's chunk index (:func:`chunk_starts`, which the
HDF5 writer also uses to check its allocation), and the file mapped read-only
(:class:`MappedRows`), so threads copy samples out of it in parallel."""

from __future__ import annotations

import math
import mmap
import os

import h5py
import numpy as np

__all__ = ["CHUNK_INFO_LIMIT", "H5_ERRORS", "MappedRows", "chunk_starts"]

#: What h5py raises on a file it cannot read as asked.
H5_ERRORS = (OSError, KeyError, ValueError, RuntimeError)

#: Without ``DatasetID.chunk_iter`` (h5py built against HDF5 < 1.12.3), chunks are located one by
#: one with ``get_chunk_info``, and each call walks the chunk index (its cost grows with the
#: number of chunks). Only files of up to this many samples are mapped that way;
#: larger ones are read through h5py.
CHUNK_INFO_LIMIT = 4096


class MappedRows:
    """Raw fixed-layout samples read without h5py: the file mapped read-only, and where each
    sample starts in it (sample ``i`` is ``data[starts[i] : starts[i] + nbytes]``).

    Copies out of the map release the GIL, so threads fill batches in parallel; the pages come
    from, and stay in, the page cache, shared by every process reading the file.
    """

    def __init__(self, data: np.ndarray, starts: np.ndarray, shape: tuple[int, ...]) -> None:
        self.data = data
        self.starts = starts
        self.shape = shape
        self.nbytes = math.prod(shape)

    @classmethod
    def locate(cls, file: h5py.File, images: h5py.Dataset) -> "MappedRows | None":
        """Map ``file`` and find every sample of ``images`` in it; None where that cannot be done
        safely (compression or other filters, chunks other than one sample each, another file
        driver, a user block, no fast chunk listing for a large file): read those through h5py.

        The map is made from the descriptor h5py itself reads (so it is the same file, even if
        the path was replaced since), and the offsets found are checked against h5py's reading
        of the first and last samples.
        """
        try:
            if os.name != "posix" or file.driver != "sec2" or file.userblock_size != 0:
                return None
            n, shape = int(images.shape[0]), tuple(int(d) for d in images.shape[1:])
            nbytes = math.prod(shape)
            plist = images.id.get_create_plist()
            layout = plist.get_layout()
            if layout == h5py.h5d.CONTIGUOUS:  # not written by packer, but a valid file: samples back to back
                base = images.id.get_offset()
                if base is None:
                    return None
                starts: np.ndarray | None = base + np.arange(n, dtype=np.int64) * nbytes
            elif layout == h5py.h5d.CHUNKED and images.chunks == (1, *shape) and plist.get_nfilters() == 0:
                key = _identity(file, n, nbytes)
                starts = _STARTS.get(key)
                if starts is None and (starts := chunk_starts(images.id, n, nbytes)) is not None:
                    _remember(key, starts)
            else:
                return None
            if starts is None:
                return None
            data = np.frombuffer(mmap.mmap(file.id.get_vfd_handle(), 0, access=mmap.ACCESS_READ), np.uint8)
            if n and (int(starts.min()) < 0 or int(starts.max()) + nbytes > len(data)):
                return None
            for i in sorted({0, n - 1}) if n else ():
                start = int(starts[i])
                if not np.array_equal(data[start : start + nbytes].reshape(shape), images[i]):
                    return None
            return cls(data, starts, shape)
        except (*H5_ERRORS, NotImplementedError):  # nothing to gain here: h5py reports a corrupt file
            return None

    def fill(self, indices: np.ndarray, out: np.ndarray) -> None:
        """Copy samples ``indices`` into ``out`` (N, C, H, W), visiting them forward through the
        file (what the disk prefers when the pages are not cached yet)."""
        starts = self.starts[indices]
        order = np.argsort(starts, kind="stable")
        data, nbytes, shape = self.data, self.nbytes, self.shape
        if out.flags.c_contiguous:
            flat = out.reshape(len(indices), nbytes)
            for j, start in zip(order.tolist(), starts[order].tolist()):
                flat[j] = data[start : start + nbytes]
        else:
            for j, start in zip(order.tolist(), starts[order].tolist()):
                out[j] = data[start : start + nbytes].reshape(shape)


#: Chunk starts found in this process, by the file's identity (device, inode, size, modification
#: time) and the samples' count and size: a DataLoader worker forked from a process that located
#: them reopens the file (see open_shared_file) but finds them here, instead of visiting every
#: chunk again at every epoch, a cost that grows with the samples (a scale walkthrough). A few
#: files at most; what is found is checked against h5py's reads as ever.
_STARTS: dict[tuple[int, ...], np.ndarray] = {}


def _identity(file: h5py.File, n: int, nbytes: int) -> tuple[int, ...]:
    st = os.fstat(file.id.get_vfd_handle())
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, n, nbytes


def _remember(key: tuple[int, ...], starts: np.ndarray) -> None:
    if len(_STARTS) >= 4:
        _STARTS.pop(next(iter(_STARTS)))
    _STARTS[key] = starts


def chunk_starts(dsid: h5py.h5d.DatasetID, n: int, nbytes: int) -> np.ndarray | None:
    """The file offset of each of ``n`` one-sample chunks of ``nbytes``, from HDF5's chunk index.

    ``DatasetID.chunk_iter`` visits every chunk in one pass (time linear in the chunks); without it,
    ``get_chunk_info`` per chunk, only up to :data:`CHUNK_INFO_LIMIT` chunks (its cost grows
    with the file). None when a sample has no chunk, or one of another size or filtered.
    """
    starts = np.full(n, -1, np.int64)

    def visit(info: h5py.h5d.StoreInfo) -> bool | None:
        row = info.chunk_offset[0]
        if info.size != nbytes or info.filter_mask or not 0 <= row < n or starts[row] >= 0:
            return True  # not one whole unfiltered sample: stop
        starts[row] = info.byte_offset
        return None

    iterate = getattr(dsid, "chunk_iter", None)
    if iterate is not None:
        if iterate(visit) is not None:
            return None
    elif n <= CHUNK_INFO_LIMIT:
        for k in range(dsid.get_num_chunks()):
            if visit(dsid.get_chunk_info(k)) is not None:
                return None
    else:
        return None
    return starts if not n or int(starts.min()) >= 0 else None
