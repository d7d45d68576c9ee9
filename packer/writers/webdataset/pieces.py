"""What runs in worker processes: :class:`PieceTask` converts the inputs of one :class:`Piece`
and writes its shard file(s), or a fragment's bare member stream, returning only bookkeeping
(:class:`PieceResult`); :func:`fragments` cuts a piece for several workers.

Everything here pickles (options, paths and arrays): workers get data and configuration,
never handles, and each opens its own files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...options import ImageOptions
from ...pool_worker import run_items
from ...preprocess.task import Encoded, Failed, ImageTask
from ...work_unit import WorkUnit, needs_main
from ..piece_writer import Piece
from .tar import TMP_PREFIX, ShardFile, ShardPart, is_full

__all__ = ["Piece", "PieceResult", "PieceTask", "fragments", "MIN_FRAGMENT"]

#: A piece is cut into fragments of at least this many inputs.
MIN_FRAGMENT = 4


@dataclass(frozen=True)
class PieceResult:
    """What a worker did with a piece: shards written and inputs that failed (offset in piece)."""

    piece: int
    start: int
    inputs: int
    parts: tuple[ShardPart, ...] = ()
    failed: tuple[tuple[int, Failed], ...] = ()
    #: What the decoders printed converting inputs that were written (offset in piece, text).
    messages: tuple[tuple[int, str], ...] = ()
    error: tuple[int, str] | None = None  # an OSError while writing, as (errno, message)
    fragment: bool = False  # parts are bare member streams (at most one), to assemble
    last: bool = True  # the piece's last fragment (always, for a whole piece)


@dataclass(frozen=True)
class PieceTask(WorkUnit):
    """Convert the inputs of a :class:`Piece` and write its shard file(s) into ``folder``
    (``None``: return each shard's bytes in its :class:`ShardPart` instead).

    Picklable (options and a path only); each worker opens its own files. ``task`` converts one
    input (default: :class:`ImageTask` of ``image``; a text conversion passes its tokenise task).
    """

    image: ImageOptions
    folder: str | None
    shard_size: int | None = None
    shard_bytes: int | None = None
    task: Callable[[Any], Encoded | Failed] | None = None

    @property
    def needs_main(self) -> bool:  # type: ignore[override]
        """Passed on from the task it wraps (packer/work_unit.py)."""
        return needs_main(self.task)

    def __call__(self, piece: Piece) -> PieceResult:
        task = self.task if self.task is not None else ImageTask(self.image)
        parts: list[ShardPart] = []
        failed: list[tuple[int, Failed]] = []
        messages: list[tuple[int, str]] = []
        shard: ShardFile | None = None
        written = 0
        raw = self.image.encoding == "raw"
        try:
            for offset, result in enumerate(run_items(task, piece.items)):
                if isinstance(result, Failed):
                    failed.append((offset, result))
                    continue
                if result.decoder_messages:
                    messages.append((offset, result.decoder_messages))
                if piece.fragment is None and shard is not None and self._full(shard, ShardFile.sample_bytes(result, raw)):
                    parts.append(shard.close())
                    shard = None
                if shard is None:
                    suffix = f"{len(parts):04d}" if piece.fragment is None else f"f{piece.fragment:04d}"
                    name = f"{TMP_PREFIX}{piece.number:06d}-{suffix}.tar"
                    shard = ShardFile(self.folder, name, self.image.encoding, write_behind=piece.fragment is None)
                shard.add(piece.start + written, result)
                written += 1
            if shard is not None:
                parts.append(shard.close(end_archive=piece.fragment is None))
                shard = None
        except OSError as exc:
            if shard is not None:
                shard.discard()
            return PieceResult(piece.number, piece.start, len(piece.items), error=(exc.errno or 0, exc.strerror or str(exc)))
        return PieceResult(
            piece.number, piece.start, len(piece.items), tuple(parts), tuple(failed), tuple(messages),
            fragment=piece.fragment is not None, last=piece.last,
        )

    def _full(self, shard: ShardFile, incoming: int) -> bool:
        return is_full(len(shard.rows), shard.member_bytes, incoming, self.shard_size, self.shard_bytes)


def fragments(piece: Piece, split: int) -> list[Piece]:
    """``piece`` cut into at most ``split`` consecutive fragments of at least :data:`MIN_FRAGMENT`
    inputs (sizes differing by at most one); one fragment is the whole piece, unfragmented."""
    count = max(1, min(split, len(piece.items) // MIN_FRAGMENT))
    if count == 1:
        return [piece]
    base, extra = divmod(len(piece.items), count)
    cut, offset = [], 0
    for j in range(count):
        size = base + (j < extra)
        items = piece.items[offset : offset + size]
        cut.append(Piece(piece.number, piece.start + offset, items, fragment=j, last=j == count - 1))
        offset += size
    return cut
