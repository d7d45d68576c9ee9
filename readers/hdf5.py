"""``HDF5Dataset``: a packer HDF5 file as a torch Dataset (layout: ``readers/formats/hdf5.py``)."""

from __future__ import annotations

from .dataset import PackedDataset
from .formats.hdf5 import HDF5Store

__all__ = ["HDF5Dataset"]


class HDF5Dataset(PackedDataset):
    """Samples of a packer HDF5 file as ``(uint8 tensor (C, H, W), int label)``.

    Safe under DataLoader workers (fork and spawn): the file opens lazily, read-only, once
    per process (h5py objects never cross a fork or a pickle).
    ``DataLoader(HDF5Dataset(path), batch_size=64)`` reads each raw batch chunk-wise, in
    increasing index order, into one array. h5py serialises all calls behind one global lock,
    so use DataLoader worker processes, not threads, for parallel reading.
    """

    store_class = HDF5Store
