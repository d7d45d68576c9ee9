"""WebDataset shards: a folder of POSIX tar files, a member index and the metadata record.

Layout (docs/FORMATS.md, "WebDataset shards"): the folder holds shards named by a ``%d``
pattern (default ``shard-%06d.tar``), numbered from 0. Sample ``i`` is two consecutive tar
members, ``KEY.EXT`` (``npy`` for raw pixels as a standard (C, H, W) uint8 ``.npy`` file, or
``jpg``/``png``) then ``KEY.cls`` (the label in ASCII decimal), with ``KEY = "%010d" % i``;
samples are stored in index order across shards. Beside the shards, :data:`INDEX_FILE` (a
plain int64 ``.npy`` array, one row per sample, columns :data:`INDEX_COLUMNS`, read as
records of :data:`INDEX_DTYPE` by :func:`load_index`) locates every
payload inside its shard, :data:`CHECKSUM_FILE` (a little-endian uint32 ``.npy``) holds every
sample's checksum (``readers/checksums.py``), and :data:`META_FILE` holds the metadata record,
written last.

This module owns the layout: ``packer/writers/webdataset/`` imports these constants, and
``readers/webdataset.py`` builds its torch datasets on :class:`ShardStore` (random access by
index) and :func:`iter_tar` (streaming). Nothing here imports torch or the webdataset library.
"""

from __future__ import annotations

import io
import mmap
import os
import re
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .._process import PerProcess, check_unreplaced, opened_key
from ..checksums import CHECKSUM_DTYPE
from ..encodings import ENCODINGS
from ..schema import IncompleteDatasetError, Metadata, PackedFormatError
from .base import SHARD_NAME, Fault, Record, Store, dataset_path, refuse_other_pattern
from .names import decode_source_names
from .wids import WIDS_FILE, wids_faults
from .tar import BLOCK, iter_tar, tar_members
from .uploading import UPLOAD_MARKER
from .npy import npy_faults, sample_array_shape

__all__ = [
    "ShardStore",
    "META_FILE",
    "INDEX_FILE",
    "INDEX_COLUMNS",
    "INDEX_DTYPE",
    "SHAPE_COLUMNS",
    "index_records",
    "index_array",
    "record_shapes",
    "load_index",
    "index_from_bytes",
    "shard_size_fault",
    "CHECKSUM_FILE",
    "SOURCES_FILE",
    "DEFAULT_PATTERN",
    "EXTENSIONS",
    "LABEL_EXTENSION",
    "sample_key",
    "read_metadata", "parse_metadata",
    "SHARD_TOKENS", "shard_tokens",
    "check_pattern",
    "iter_tar",
]

#: The metadata record (UTF-8 JSON), written last: without it the folder is unfinished.
META_FILE = "packer.json"
#: Where each sample's payload lies: an int64 array of shape (count, len(INDEX_COLUMNS)).
INDEX_FILE = "packer-index.npy"
#: One row of :data:`INDEX_FILE`, by name: the per-sample record shared by this index, the
#: resume journal (``packer/writers/journal.py`` extends it) and the WebDataset writer.
#: ``offset``/``nbytes``: the payload inside the shard file, i.e. the pixel bytes after the
#: .npy header for raw samples, the whole .jpg/.png member otherwise. On disk the index stays a
#: plain (count, 7) int64 array: :func:`index_records` and :func:`index_array` convert.
INDEX_DTYPE = np.dtype([(name, "<i8") for name in ("shard", "offset", "nbytes", "label", "channels", "height", "width")])
#: Columns of :data:`INDEX_FILE`, in order (the names of :data:`INDEX_DTYPE`).
INDEX_COLUMNS: tuple[str, ...] = tuple(INDEX_DTYPE.names or ())
#: The fields of a sample's (C, H, W) shape, in a record of :data:`INDEX_DTYPE` (or one extending it).
SHAPE_COLUMNS = ("channels", "height", "width")
#: Every sample's checksum (readers/checksums.py): a uint32 ``.npy`` array of shape (count,).
CHECKSUM_FILE = "packer-crc32.npy"
#: Every sample's source name (readers/formats/names.py): a JSON array; absent in older datasets.
SOURCES_FILE = "packer-sources.json"
#: Shard file names when DST is a folder; a DST like ``out/train-%06d.tar`` picks its own.
DEFAULT_PATTERN = "shard-%06d.tar"
#: Member extension of the image of a sample, by metadata ``encoding`` (from the encoding table).
EXTENSIONS: dict[str, str] = {name: encoding.extension for name, encoding in ENCODINGS.items()}
LABEL_EXTENSION = "cls"
#: ``extra`` key of a text dataset's token ids per shard (EOS included), parallel to ``shard_counts``;
#: datasets written before it lack it (:func:`shard_tokens` computes it from their index).
SHARD_TOKENS = "shard_tokens"
#: Sample keys: the zero-padded sample index (fixed width: keys sort in sample order).
KEY_FORMAT = "%010d"
RECORD = 20 * BLOCK  # tar files end with zero blocks up to a multiple of this, as tarfile writes


def index_records(array: np.ndarray) -> np.ndarray:
    """The (count, 7) int64 index as stored -> (count,) records of :data:`INDEX_DTYPE` (a view
    when ``array`` is C-contiguous little-endian int64, as :func:`load_index` returns it)."""
    array = np.ascontiguousarray(array, "<i8")
    if array.ndim != 2 or array.shape[1] != len(INDEX_COLUMNS):
        raise PackedFormatError(f"expected a (count, {len(INDEX_COLUMNS)}) index, got shape {array.shape}")
    return array.view(INDEX_DTYPE).reshape(len(array))


def index_array(records: np.ndarray) -> np.ndarray:
    """Records with (at least) the fields of :data:`INDEX_DTYPE` -> the (count, 7) int64 array
    :data:`INDEX_FILE` stores."""
    out = np.empty(len(records), INDEX_DTYPE)
    for name in INDEX_COLUMNS:
        out[name] = records[name]
    return out.view("<i8").reshape(len(records), len(INDEX_COLUMNS))


def record_shapes(records: np.ndarray) -> np.ndarray:
    """The (count, 3) int64 (C, H, W) shapes of records with the :data:`SHAPE_COLUMNS` fields."""
    return np.stack([np.asarray(records[name], np.int64) for name in SHAPE_COLUMNS], axis=1).reshape(len(records), 3)


def shard_tokens(records: np.ndarray, shards: int) -> list[int]:
    """Token ids per shard of a text dataset, from its index records: a document's ``width`` is its
    token count (its shape is ``(1, 1, n)``)."""
    out = np.zeros(shards, np.int64)
    np.add.at(out, np.asarray(records["shard"], np.int64), np.asarray(records["width"], np.int64))
    return [int(n) for n in out]


def sample_key(index: int) -> str:
    """The tar member key (name without extension) of sample ``index``."""
    return KEY_FORMAT % index


def check_pattern(pattern: str) -> str:
    """Return ``pattern`` if it is a valid shard file name pattern (one ``%d``, ends in .tar)."""
    if not SHARD_NAME.fullmatch(pattern):
        raise PackedFormatError(f"{pattern!r}: a shard name pattern needs exactly one %d field and the .tar suffix, "
                                "for example train-%06d.tar")
    if re.search(r"%[1-9][0-9]*d", pattern):  # t-%6d.tar: 't-     0.tar', which no brace pattern names
        zeros = re.sub(r"%([1-9][0-9]*)d", r"%0\1d", pattern)
        raise PackedFormatError(f"{pattern!r}: pads the shard number with spaces; pad it with zeros, for example {zeros}")
    return pattern


def read_metadata(folder: str | Path) -> Metadata:
    """The validated metadata record of a shard folder."""
    folder = Path(folder)
    try:
        raw = (folder / META_FILE).read_bytes()
    except FileNotFoundError:
        raise IncompleteDatasetError(
            f"{folder}: no {META_FILE}: the conversion did not finish, or these are shards packer did not write "
            f"(stream them by name, StreamingShards('{folder}/{{00000..00009}}.tar'), or convert them: packer convert {folder} out.blob)"
        ) from None
    return parse_metadata(raw, str(folder))


def parse_metadata(raw: bytes, where: str) -> Metadata:
    """The validated metadata record of a shard folder, from the bytes of its :data:`META_FILE`
    (``where`` names the folder in errors: a path or a URL)."""
    folder = where
    meta = Metadata.from_json(raw, where=str(folder)).expect_format("webdataset", where=str(folder))
    extra = meta.extra
    shards, counts, sizes = extra.get("shards"), extra.get("shard_counts"), extra.get("shard_sizes")
    if not (
        isinstance(shards, list)
        and isinstance(counts, list)
        and isinstance(sizes, list)
        and len(shards) == len(counts) == len(sizes)
        and all(isinstance(s, str) and "/" not in s for s in shards)
        and all(isinstance(c, int) for c in counts)
    ):
        raise PackedFormatError(f"{folder}: metadata 'extra' does not list the shards and their sample counts")
    if sum(counts) != meta.count:
        raise PackedFormatError(f"{folder}: metadata 'count' is {meta.count:,}, its shards' sample counts add up to {sum(counts):,}")
    tokens = extra.get(SHARD_TOKENS)
    if tokens is not None and not (isinstance(tokens, list) and len(tokens) == len(shards) and meta.kind == "text"
                                   and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in tokens)):
        raise PackedFormatError(f"{folder}: metadata '{SHARD_TOKENS}' is not a text dataset's token count of each of its {len(shards)} shards")
    if tokens is not None and sum(tokens) != meta.tokens:
        raise PackedFormatError(f"{folder}: metadata 'tokens' is {meta.tokens:,}, its shards' token counts add up to {sum(tokens):,}")
    return meta


class ShardStore(Store):
    """Random access to the samples of a packer shard folder, by index.

    The member index (:data:`INDEX_FILE`) gives each sample's shard and byte range; shards are
    memory-mapped read-only, lazily, once per process (a forked or spawned DataLoader worker maps
    its own), so a batch is a few memory copies.
    """

    format_name = "webdataset"
    label = "WebDataset"
    own_names = frozenset({META_FILE, INDEX_FILE, CHECKSUM_FILE, SOURCES_FILE, WIDS_FILE, UPLOAD_MARKER})

    def _written_names(self) -> list[str]:
        return list(self.meta.extra["shards"])

    def __init__(self, path: str | Path, *, verify: bool | None = None) -> None:
        key = self._opened_key(path)  # (the dataset read: checked as each process and shard opens)
        super().__init__(path, verify=verify)
        self.shards: tuple[str, ...] = tuple(self.meta.extra["shards"])
        refuse_other_pattern(path, self.path, self.shards)
        self._files = self._shard_files(key)
        self._check_files()

    # -- where the files are: a local folder here; a URL's, readers/formats/remote_shards.py -----
    def _opened_key(self, path: str | Path) -> tuple[int, ...] | None:
        """What identifies the metadata record about to be read (``readers/_process.py``)."""
        return opened_key(dataset_path(path) / META_FILE)

    def _shard_files(self, key: tuple[int, ...] | None) -> PerProcess:
        """This process's index and shard bytes (``.get()``: an object with ``index`` and ``map(shard)``)."""
        return PerProcess(_ShardFiles(str(self.path), self.shards, tuple(self.meta.extra["shard_sizes"]), key))

    def _read_file(self, name: str) -> bytes:
        """The bytes of the file ``name`` beside the shards (``FileNotFoundError`` when missing)."""
        return (self.path / name).read_bytes()

    def _index_rows(self) -> int:
        """How many samples the member index holds."""
        return len(load_index(self.path))

    def _shard_sizes(self) -> list[int | None]:
        """Each shard's size in bytes, in :attr:`shards` order (``None``: missing)."""
        sizes: list[int | None] = []
        for name in self.shards:
            try:
                sizes.append((self.path / name).stat().st_size)
            except FileNotFoundError:
                sizes.append(None)
        return sizes

    @classmethod
    def mismatch(cls, path: Path) -> str | None:
        if not path.is_dir():
            return "not a folder of WebDataset shards (this is a file)"
        if (path / META_FILE).exists() or (path / INDEX_FILE).exists():
            return None
        with os.scandir(path) as entries:
            if any(e.name.endswith(".tar") for e in entries):
                return None
        return f"not a packer shard folder (no {META_FILE}, {INDEX_FILE} or .tar shards inside)"

    def _read_metadata(self) -> Metadata:
        return read_metadata(self.path)

    def _check_files(self) -> None:
        rows = self._index_rows()
        if rows != self.meta.count:
            raise PackedFormatError(
                f"{self.path}/{INDEX_FILE}: has shape ({rows}, {len(INDEX_COLUMNS)}), expected "
                f"({self.meta.count}, {len(INDEX_COLUMNS)}): the folder is corrupt; convert again"
            )
        found = zip(self.shards, self._shard_sizes(), self.meta.extra["shard_sizes"])
        faults = [fault for name, size, expected in found if (fault := shard_size_fault(f"{self.path}/{name}", size, expected))]
        if len(faults) > 1:  # every damaged shard in one line (packer verify reported the first only)
            shown = "; ".join(faults[:5]) + (f"; and {len(faults) - 5:,} more" if len(faults) > 5 else "")
            raise PackedFormatError(f"{len(faults):,} of {len(self.shards):,} shards are missing or damaged: {shown}")
        if faults:
            raise PackedFormatError(faults[0])

    def stored_checksums(self) -> np.ndarray | None:
        if not self.meta.checksum:  # (a checksum file beside it: the metadata was edited, and verify passed damaged pixels)
            try:
                self._read_file(CHECKSUM_FILE)
            except FileNotFoundError:
                return None
            raise PackedFormatError(f"{self.path}/{META_FILE}: says no checksums are stored, but {CHECKSUM_FILE} is there")
        try:
            values = np.load(io.BytesIO(self._read_file(CHECKSUM_FILE)), allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise PackedFormatError(f"{self.path}/{CHECKSUM_FILE}: cannot read the checksums ({exc})") from None
        if values.dtype != CHECKSUM_DTYPE or values.shape != (self.meta.count,):
            raise PackedFormatError(
                f"{self.path}/{CHECKSUM_FILE}: expected uint32 ({self.meta.count},), got {values.dtype} {values.shape}"
            )
        return values

    def source_names(self) -> list[str] | None:
        try:
            raw = self._read_file(SOURCES_FILE)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise PackedFormatError(f"{self.path}/{SOURCES_FILE}: cannot read the source names ({exc})") from None
        return decode_source_names(raw, self.meta.count, where=f"{self.path}/{SOURCES_FILE}")

    def _records(self, indices: Sequence[int]) -> Iterator[Record]:
        files = self._files.get()
        rows = files.index[np.asarray(indices, dtype=np.int64)]
        columns = zip(rows["shard"].tolist(), rows["offset"].tolist(), rows["nbytes"].tolist(), rows["label"].tolist())
        for (shard, offset, nbytes, label), shape in zip(columns, record_shapes(rows).tolist()):
            data = files.map(shard)
            yield label, tuple(shape), data[offset : offset + nbytes]

    def _fill_raw(self, indices: np.ndarray, out: np.ndarray, labels: np.ndarray) -> None:
        files = self._files.get()
        rows = files.index[indices]
        expected = out[0].nbytes if len(out) else 0
        bad = np.flatnonzero(rows["nbytes"] != expected)
        if bad.size:
            j = int(bad[0])
            raise PackedFormatError(
                f"{self.path}: sample {int(indices[j])} has {int(rows['nbytes'][j])} bytes, expected {expected}: the index is corrupt"
            )
        labels[:] = rows["label"]
        flat = out.reshape(len(out), expected)  # not -1: an empty batch has no size to infer
        for j, (shard, offset) in enumerate(zip(rows["shard"].tolist(), rows["offset"].tolist())):
            flat[j] = np.frombuffer(files.map(shard), np.uint8, expected, offset)

    def _payload_offsets(self) -> np.ndarray:
        return np.concatenate([np.zeros(1, np.int64), np.cumsum(self._files.get().index["nbytes"], dtype=np.int64)])

    def where(self, index: int) -> str:
        shard = int(self._files.get().index["shard"][index]) if 0 <= index < len(self) else -1
        return f"sample {index} ({self.shards[shard]})" if 0 <= shard < len(self.shards) else f"sample {index}"

    def structure_faults(self) -> Iterator[Fault]:
        """Every shard is a valid tar holding, in order, each of its samples' ``KEY.EXT`` and
        ``KEY.cls`` members, at the offsets and sizes of the member index, with the index's
        labels; a ``.npy`` member's header gives the sample's shape and dtype."""
        yield from wids_faults(self._read_file, self.meta)
        index = self._files.get().index
        extension, dtype, shapes = EXTENSIONS[self.meta.encoding], self.meta.dtype, record_shapes(index).tolist()
        for number, name in enumerate(self.shards):
            where, rows = f"shard {name}", np.flatnonzero(index["shard"] == number)
            if len(rows) != self.meta.extra["shard_counts"][number]:  # (StreamingShards plans ranks by the metadata's counts)
                yield where, f"the metadata says it holds {self.meta.extra['shard_counts'][number]} samples, the index {len(rows)}"
            tokens = self.meta.extra.get(SHARD_TOKENS)
            if tokens is not None and tokens[number] != int(index["width"][rows].sum()):  # (StreamingShards' blocks count on it)
                yield where, f"the metadata says it holds {tokens[number]:,} tokens, the index {int(index['width'][rows].sum()):,}"
            try:
                data = self._files.get().map(number)
            except (OSError, PackedFormatError) as exc:
                yield where, f"cannot read ({exc})"
                continue
            members: list[tuple[str, int, int]] = []
            try:
                members.extend(tar_members(data))
            except PackedFormatError as exc:
                yield where, str(exc)
            if len(members) != 2 * len(rows):
                yield where, f"holds {len(members)} members, expected {2 * len(rows)} ({len(rows)} samples)"
            for k, i in enumerate(rows[: len(members) // 2].tolist()):
                (image, at, size), (label_name, label_at, label_size) = members[2 * k : 2 * k + 2]
                row, sample, key = index[i], f"sample {i} ({name})", sample_key(i)
                offset, nbytes = int(row["offset"]), int(row["nbytes"])
                if (image, label_name) != (f"{key}.{extension}", f"{key}.{LABEL_EXTENSION}"):
                    yield sample, f"members are {image!r}, {label_name!r}, expected {key}.{extension}, {key}.{LABEL_EXTENSION}"
                if not (at <= offset and offset + nbytes == at + size):
                    yield sample, f"the index puts its payload at {offset}+{nbytes}, the tar member is at {at}+{size}"
                text = data[label_at : label_at + label_size]
                if text != str(int(row["label"])).encode("ascii"):
                    yield sample, f"its .{LABEL_EXTENSION} member says {bytes(text[:20]).decode('ascii', 'replace')!r}, the index says {int(row['label'])}"
                if extension == EXTENSIONS["raw"]:
                    yield from npy_faults(data[at:offset], sample_array_shape(tuple(shapes[i]), dtype), dtype, sample)


def load_index(folder: str | Path) -> np.ndarray:
    """The member index of a shard folder as (count,) records of :data:`INDEX_DTYPE`
    (memory-mapped read-only); a missing or malformed index raises naming the file."""
    folder = Path(folder)
    return _checked_index(lambda: np.load(folder / INDEX_FILE, mmap_mode="r", allow_pickle=False), str(folder))


def index_from_bytes(raw: bytes | None, folder: str) -> np.ndarray:
    """:func:`load_index` of the bytes of the member index of the shard folder ``folder`` (a
    URL's; ``None``: it has none), in memory."""
    def read() -> np.ndarray:
        if raw is None:
            raise FileNotFoundError(folder)
        return np.load(io.BytesIO(raw), allow_pickle=False)

    return _checked_index(read, folder)


def _checked_index(read, folder: str) -> np.ndarray:
    """The records of the index ``read()`` loads, checked (errors name ``folder``'s index)."""
    try:
        index = read()
    except FileNotFoundError:
        raise IncompleteDatasetError(f"{folder}: no {INDEX_FILE}: the folder is incomplete; convert again") from None
    except ValueError as exc:
        raise PackedFormatError(f"{folder}/{INDEX_FILE}: not a valid .npy index ({exc}); convert again") from None
    if index.dtype != np.int64 or index.ndim != 2 or index.shape[1] != len(INDEX_COLUMNS) or not index.flags.c_contiguous:
        raise PackedFormatError(
            f"{folder}/{INDEX_FILE}: expected a (count, {len(INDEX_COLUMNS)}) int64 array, got {index.dtype} {index.shape}; convert again"
        )
    return index_records(index)


def shard_size_fault(where: str, size: int | None, expected: int) -> str | None:
    """What is wrong with the shard ``where`` of ``size`` bytes (``None``: missing), which the
    metadata records as ``expected`` bytes; ``None`` when nothing is."""
    if size is None:
        return f"{where}: shard is missing; the folder is incomplete, convert again"
    if size != expected:
        return f"{where}: shard has {size:,} bytes, the metadata says {expected:,}: it is truncated or was changed; convert again"
    return None


class _ShardFiles:
    """Picklable opener and, once opened, this process's index and shard maps."""

    def __init__(self, folder: str, shards: tuple[str, ...], sizes: tuple[int, ...], key: tuple[int, ...] | None = None) -> None:
        self.folder, self.shards, self.sizes, self.key = folder, shards, sizes, key
        self.index: np.ndarray = np.empty(0, INDEX_DTYPE)
        self._maps: dict[int, mmap.mmap] = {}

    def __call__(self) -> "_ShardFiles":
        opened = _ShardFiles(self.folder, self.shards, self.sizes, self.key)
        opened.index = load_index(self.folder)
        check_unreplaced(Path(self.folder) / META_FILE, self.key, self.folder)  # (after: the index read is this dataset's)
        return opened

    def map(self, shard: int) -> mmap.mmap:
        data = self._maps.get(shard)
        if data is None:
            path = Path(self.folder) / self.shards[shard]
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size != self.sizes[shard]:
                    raise PackedFormatError(shard_size_fault(str(path), size, self.sizes[shard]))
                data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            check_unreplaced(Path(self.folder) / META_FILE, self.key, self.folder)  # (after: the shard opened is this dataset's)
            self._maps[shard] = data
        return data
