"""Writers whose output worker processes write, a :class:`Piece` of consecutive inputs each
(WebDataset shards), and the calls the driver makes to them instead of :meth:`Writer.add`."""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..options import ImageOptions
from ..preprocess.task import Encoded, Failed
from .base import Writer

__all__ = ["Piece", "PieceWriter", "Written"]


@dataclass(frozen=True)
class Piece:
    """A run of consecutive inputs that one worker converts and writes (see :class:`PieceWriter`).

    ``number``: the piece's position in the whole input list; ``start``: the index of its first
    input (also the key its first sample gets if nothing before it failed). ``fragment``:
    ``None`` for a whole piece, else this fragment's position in piece ``number`` (a piece cut
    for several workers; ``start`` is then the fragment's own first input), and ``last``
    whether it is the piece's last fragment. ``items``: image items or text documents."""

    number: int
    start: int
    items: Sequence[Any]
    fragment: int | None = None
    last: bool = True


@dataclass(frozen=True)
class Written:
    """The outcome of an input a piece's worker wrote whose decoders printed something
    (``decoder_messages``, captured in the worker): the driver warns with it, as for a sample
    converted by the pool (an input written without a word is just ``None``)."""

    decoder_messages: str


class PieceWriter(Writer, metaclass=ABCMeta):
    """A writer whose output worker processes write, a :class:`Piece` of consecutive inputs each.

    The driver (``packer/engine.py``) checks ``isinstance(writer, PieceWriter)`` and then, instead
    of converting inputs itself and calling :meth:`add` per sample:

    1. calls :meth:`pieces` once, for the inputs left to convert (after a resume they start at
       :attr:`resumed_inputs`, always a piece boundary);
    2. calls :meth:`piece_task` once, for the picklable work unit it maps over those pieces
       (local pool or Ray): ``task(piece)`` converts and writes a piece, returning a result;
    3. hands each result, in piece order, to :meth:`add_piece`, which publishes what the
       worker wrote and returns each input's outcome.

    :meth:`progress`, :meth:`finish` and the rest are as for every writer; a checkpoint falls
    only at the end of a whole piece (:meth:`_checkpoint_ready`). Written samples are booked
    with :meth:`_record_rows`.
    """

    def piece_crashed(self, piece: Piece, reason: str) -> str:
        """The one line that stops the run when the worker converting ``piece`` crashed or hung
        (``reason``: ``"crashed the decoder (SIGSEGV)"``, ``"timed out after 120 s"``)."""
        return (f"{piece.items[0].path}: the worker converting the {self.format_name} piece of {len(piece.items):,} inputs "
                f"that starts with this input {reason} (a piece is converted whole: convert to a format written sample by "
                "sample, such as .lmdb, to find and skip the input that does it, or raise --timeout)")

    @abstractmethod
    def pieces(self, items: Sequence[Any], image: ImageOptions, *, workers: int | None = None,
               sample_bytes: int | None = None) -> list[Piece]:
        """``items`` cut into consecutive pieces, in order. Where the pieces begin and end depends
        only on the options and the source, never on ``workers`` (the output is the same for any
        worker count); with ``workers`` given a writer may cut pieces into fragments to keep every
        worker busy. ``sample_bytes``: the job's estimate of a stored payload, to plan pieces by bytes."""

    @abstractmethod
    def piece_task(
        self, image: ImageOptions, task: Callable[[Any], Encoded | Failed] | None = None, *, in_memory: bool = False
    ) -> Callable[[Piece], Any]:
        """The picklable work unit a worker runs on one :class:`Piece`; it returns the result
        :meth:`add_piece` takes. ``task`` converts one input (default: the image task of
        ``image``; a text conversion passes its tokenise task). ``in_memory``: the task returns
        the bytes it wrote instead of writing into ``DST.partial`` (for tasks that may run on
        another machine than this writer, e.g. Ray with a URL DST)."""

    @abstractmethod
    def add_piece(self, result: Any) -> list[Failed | Written | None]:
        """Publish the output of one piece's task (``result``: what :meth:`piece_task`'s work unit
        returned), called in piece order. Returns one outcome per input of the piece: ``None``
        when written (:class:`Written` when its decoders printed something), else its
        :class:`Failed` (for the caller to record, or raise with
        ``--on-error fail``). Raises :class:`OutputError` if the worker could not write."""

    def _write(self, index: int, sample: Encoded) -> None:
        raise NotImplementedError(f"{type(self).__name__} writes its output in worker processes: drive it with packer.convert()")
