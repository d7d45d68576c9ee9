"""``HDF5Dataset``: a packer HDF5 file as a torch Dataset (layout: ``readers/formats/hdf5.py``)."""

from __future__ import annotations

from .dataset import PackedDataset
from .formats.hdf5 import HDF5Store

__all__ = ["HDF5Dataset"]


class HDF5Dataset(PackedDataset):
    """Samples of a packer HDF5 file as ``(uint8 tensor (C, H, W), int label)``.

    Safe under DataLoader workers (fork and spawn): the file opens lazily, read-only, once
    per process (h5py objects never cross a fork or a pickle).
    ``DataLoader(HDF5Dataset(path), batch_size=64)`` reads each raw batch into one array. An
    uncompressed fixed-shape file is read from a memory map at each sample's chunk offset,
    bypassing h5py, so threads (``readers.Loader``) read it in parallel; a compressed or
    variable-shape file goes through h5py, whose calls share one global lock: use DataLoader
    worker processes, not threads, for parallel reading of those.
    """

    store_class = HDF5Store
