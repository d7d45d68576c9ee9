"""A finished packer HDF5 file copied without the dead space HDF5 keeps (the writer's side of
``readers/formats/hdf5.py``; packer/writers/hdf5.py calls it).

HDF5 never gives back a deleted dataset's space, so samples the writer moved from ``images`` to
``payload`` (a later sample of another shape: the flat layout) left their first copy dead in
the file, up to as large as the samples (a plain-library walkthrough: 194 MB where the samples
take 112). The datasets are copied as stored (``H5Ocopy``: chunks and filters unchanged), in the
order the writer made them, and the metadata attribute last, into a new file that replaces the
old one: the same for any worker count, as the old one was.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import h5py

from readers.formats.hdf5 import CHECKSUMS, LABELS, META_ATTR, OFFSETS, PAYLOAD, SHAPES, SOURCES
from readers.formats.hdf5_rows import H5_ERRORS

__all__ = ["compact", "free_bytes"]

log = logging.getLogger("packer")

#: Room kept free beside the copy for HDF5's own structures.
_MARGIN = 1 << 20


def free_bytes(folder: Path) -> int:
    """Bytes an unprivileged process may still write on ``folder``'s filesystem."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def compact(path: Path, target: Path, meta_json: str, dst: Path, libver: tuple[str, str]) -> None:
    """Copy the finished file ``path`` through ``target`` (beside it, packer's own) and put the
    copy (of HDF5 file-format bounds ``libver``, the writer's) in its place, unless its dead
    space is under a sixteenth of the rest. With too little
    free disk, or a copy that fails, the file stays as it is (complete), said in a warning."""
    with h5py.File(path, "r", locking=False) as file:
        live = sum(file[name].id.get_storage_size() for name in file)
        dead = os.path.getsize(path) - live
        if dead < live // 16:
            return
        try:
            if free_bytes(target.parent) < live + _MARGIN:
                raise OSError(errno.ENOSPC, "too little free disk to copy it")
            with h5py.File(target, "w", libver=libver, locking=False) as copy:
                for name in (PAYLOAD, LABELS, CHECKSUMS, SOURCES, OFFSETS, SHAPES):
                    if name in file:
                        file.copy(file[name], copy, name=name)
                copy.flush()
                copy.attrs[META_ATTR] = meta_json  # last, as the writer writes it
        except H5_ERRORS as exc:
            target.unlink(missing_ok=True)
            log.warning("%s: %d MB of samples moved to the layout of varying shapes stay in the file, not copied without "
                        "them (%s; h5repack does it later)", dst, dead >> 20, exc)
            return
        except BaseException:
            target.unlink(missing_ok=True)
            raise
    os.replace(target, path)
