"""A row of a Parquet file of images as an input (:class:`ParquetRow`), and reading its image
bytes in a worker (:func:`read_row_image`); listing the rows: packer/sources/parquet_images.py.

A worker reads a row group's image column as a stream of batches of :data:`BATCH_ROWS` rows
(``ParquetFile.iter_batches``), keeping one batch and its place: the next rows of the group come
from it or from the batches after it, so a worker's memory holds one batch whatever the row
group's size (pyarrow's own writer makes one group of up to a million rows: the whole column in
each worker, GBs, when read at once). A row before the kept batch (another chunk of the same
group, handed out earlier) starts the group's stream again, and so does any error; a file
whose size or time differs from the listing's is refused."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator

from .images import ImageItem

__all__ = ["ParquetRow", "read_row_image", "BATCH_ROWS"]

#: Rows of the image column a worker decodes from the file at once.
BATCH_ROWS = 64


@dataclass(frozen=True)
class ParquetRow(ImageItem):
    """A row of a Parquet file: ``path`` is ``FILE:N`` (messages); its image is row ``row`` of
    row group ``group`` of ``file``, in ``column`` (a struct's ``bytes`` field when ``struct``)."""

    file: str = ""
    group: int = 0
    row: int = 0
    column: str = ""
    struct: bool = False
    #: The file's ``size:mtime_ns`` when it was listed: a file replaced since is refused, never read.
    stamp: str = ""


class _Cursor:
    """A row group's image column, streamed: the batch read last and the row it starts at."""

    def __init__(self, item: ParquetRow) -> None:
        import pyarrow.parquet as pq

        handle = open(item.file, "rb")  # (stat-ed through the handle read: a file replaced after the check is not read)
        st = os.fstat(handle.fileno())
        if item.stamp and f"{st.st_size}:{st.st_mtime_ns}" != item.stamp:
            handle.close()
            raise ValueError("the Parquet file changed since it was listed")
        self.key = _key(item)
        self.struct = item.struct
        self._batches: Iterator[Any] = pq.ParquetFile(handle).iter_batches(
            batch_size=BATCH_ROWS, row_groups=[item.group], columns=[item.column], use_threads=False)
        self.start, self.values, self.paths = 0, None, None  # the kept batch: rows start .. start + len(values)

    def value(self, row: int) -> bytes | None:
        """Row ``row``'s image bytes (``None``: null); ``row`` not before the kept batch."""
        while self.values is None or row >= self.start + len(self.values):
            if self.values is not None:
                self.start += len(self.values)
            batch = next(self._batches, None)
            if batch is None:
                raise ValueError("the Parquet file changed since it was listed (its row group is shorter)")
            column = batch.column(0)
            self.values = column.field("bytes") if self.struct else column
            self.paths = column.field("path") if self.struct and column.type.get_field_index("path") >= 0 else None
        return self.values[row - self.start].as_py()

    def path(self, row: int) -> str | None:
        """Row ``row``'s image path (a struct's ``path`` field; ``None``: null or none), once :meth:`value` read it."""
        return None if self.paths is None else self.paths[row - self.start].as_py()


_cursor: _Cursor | None = None


def _key(item: ParquetRow) -> tuple[int, str, str, int, str]:
    return (os.getpid(), item.file, item.stamp, item.group, item.column)  # (a forked worker never shares its parent's stream)


def read_row_image(item: ParquetRow) -> bytes:
    """The image bytes of ``item``, read in the worker (the module doc). Raises ``OSError`` or
    ``ValueError`` with the reason."""
    global _cursor
    import pyarrow as pa

    try:
        if _cursor is None or _cursor.key != _key(item) or item.row < _cursor.start:
            _cursor = None
            _cursor = _Cursor(item)
        data = _cursor.value(item.row)
        path = _cursor.path(item.row) if data is None else None
    except pa.ArrowException as exc:
        _cursor = None
        raise ValueError(f"cannot read its row group from the Parquet file ({exc})") from None
    except (OSError, ValueError):  # (its place in the group is no longer known: the next row starts the stream again)
        _cursor = None
        raise
    if data is None:  # (a path alone: a dataset saved without embedding its images; else no image at all)
        raise ValueError(f"the row holds no image bytes, only a path to the image, not embedded ({path})" if path else "the row holds no image (null)")
    return data
