"""Write WebDataset shards (layout owned by ``readers/formats/webdataset.py``), in parallel.

Three modules: :mod:`.tar` (the bytes of a shard: members, the end of an archive, assembly
from fragments, renumbering), :mod:`.pieces` (what runs in worker processes) and
:mod:`.writer` (:class:`ShardWriter`, in the driver's process).

The input list is cut into consecutive *pieces* (:meth:`ShardWriter.pieces`); a worker runs
:class:`PieceTask` on a piece: it converts each input with :class:`ImageTask` and writes the
piece's shard file(s) under temporary names inside ``DST.partial``, rolling into a new shard
whenever ``shard_size`` samples or ``shard_bytes`` member bytes would be exceeded. It returns
only bookkeeping (:class:`PieceResult`). The parent (:meth:`ShardWriter.add_piece`, in input
order) gives the shards their final numbers and names and records the member index.

Where the output goes is the writer's *sink* (:class:`ShardSink`): none, and the shards stay in
``DST.partial``, renamed to ``DST`` at the end; a sink (``packer/remote.py``'s uploader for a
URL DST) takes each shard as it is published, and the index, checksums and metadata (last) at
the end, so local disk holds only the shards not yet stored. When the tasks may run on other
machines than the writer (Ray with a sink: the writer's folder is local to the driver), a
piece's shards come back as bytes in :class:`PieceResult` instead of files (``in_memory``).

When there are fewer pieces than about two per worker (small datasets, or few large shards),
:meth:`ShardWriter.pieces` cuts each piece into *fragments*, consecutive runs of its inputs that
different workers convert at once. A fragment's task writes a bare tar member stream (members
only, no end-of-archive blocks); the parent (:meth:`ShardWriter.add_piece`, in order) copies the
streams into the piece's shard(s), rolling over exactly where one worker would have, and ends
each shard once. That costs the parent a copy of every byte, so with enough pieces (the scale
path) workers keep writing whole shards and the parent only renames them.

Sample keys are dense (``0 .. count-1``) even when inputs fail: a worker keys its samples as if
nothing before its piece had failed (first key = the piece's first input index); when earlier
inputs did fail, the parent rewrites the (fixed-width) member names in the 512-byte tar headers
in place before renaming the shard. A shard so renumbered is byte-identical to one written
with the right keys to begin with, and piece boundaries depend only on the options, never on
the worker count: the output is identical whatever the worker count (and whether pieces were fragmented).
"""

from .pieces import Piece, PieceResult, PieceTask
from .destination import brace_pattern, pattern_refusal
from .writer import DEFAULT_SHARD_SIZE, ShardSink, ShardWriter, split_destination

__all__ = ["ShardWriter", "ShardSink", "PieceTask", "Piece", "PieceResult", "split_destination", "pattern_refusal", "brace_pattern", "DEFAULT_SHARD_SIZE"]
