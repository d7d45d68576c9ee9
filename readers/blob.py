"""``RAMDataset``: a packer blob held in RAM once, shared by DataLoader workers (layout:
``readers/formats/blob.py``)."""

from __future__ import annotations

from pathlib import Path

from .dataset import PackedDataset, Transform
from .epoch import flag
from .formats.blob import BlobStore

__all__ = ["RAMDataset"]


class RAMDataset(PackedDataset):
    """Samples of a packer ``.blob`` file as ``(uint8 tensor (C, H, W), int label)``.

    ``in_memory=True`` (default) reads the whole file into RAM now, once, into anonymous shared
    memory: forked DataLoader workers inherit it and spawned ones are sent its file descriptor,
    so N workers do not make N copies (one made at the module level of a script that spawned
    workers run again loads there only on first use, or before that worker forks). Datasets over
    the same file in one process share one copy. ``in_memory=False`` maps the file instead (lazily, once per process): the OS page
    cache holds the pages, shared by every process, and evicts them under memory pressure.

    A plain ``pickle.dumps`` of the dataset carries only the path and options; the unpickled
    dataset loads its own copy on first use. Fixed-shape raw batches (``__getitems__``,
    :meth:`read_batch`) are one ``numpy.take`` gather into the batch array.
    """

    store_class = BlobStore

    def __init__(
        self, path: str | Path, transform: Transform | None = None, *, in_memory: bool = True, verify: bool | None = None
    ) -> None:
        in_memory = flag(in_memory, "in_memory")  # ("no" is truthy: it loaded the whole file)
        # mapped first: another format, or a text blob, is refused before it is loaded into RAM for nothing
        super().__init__(path, transform, verify=verify)
        if in_memory:
            self.store = BlobStore(path, in_memory=True, verify=verify)

    @property
    def in_memory(self) -> bool:
        """Whether the file was copied into RAM (else it is memory-mapped)."""
        return self.store.in_memory
