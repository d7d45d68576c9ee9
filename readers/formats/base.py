"""What every packed store shares: index checks, the batch path and decoding, in numpy.

A *store* is the torch-free access to one packed dataset: its metadata record and its samples
as uint8 arrays. Torch Datasets (``readers/lmdb.py`` and friends) wrap a store; the CLI
(``packer info``, ``packer verify``) uses stores directly, so it never imports torch.

A format subclasses :class:`Store` and supplies how to tell its paths from others
(:meth:`Store.mismatch`: a store refuses, in one line, a path that is not its format), how to
read its metadata record (:meth:`Store._read_metadata`) and how to walk the stored records of a
list of indices (:meth:`Store._records`). Formats whose storage allows something faster for fixed-shape raw
batches (one gather from an array, a chunked HDF5 read) also override :meth:`Store._fill_raw`.

What tools ask of a format, whatever it holds, is a method here that the format may override,
so nothing outside the format's module needs its layout: :meth:`Store.records` (the stored
records, for ``packer verify``), :meth:`Store.structure_faults` (the format's own structure:
LMDB keys, WebDataset tar members), :meth:`Store.where` (a sample's location in messages),
:meth:`Store.payload_offsets` and :meth:`Store.read_stream` (every payload back to back: a text
dataset's token stream, ``readers/formats/tokens.py``).

Integrity on read: a store opened with ``verify=True`` checks every sample the image reads
(:meth:`Store.read`, :meth:`Store.read_batch`, :meth:`Store.read_samples`) hand out against
the checksum stored when it was written (``readers/checksums.py``), on every path, the fast
fixed-shape batch fills included (those check the filled rows, which are the payload bytes),
and raises :class:`~readers.checksums.CorruptSampleError` naming the dataset and
:meth:`Store.where` the sample is. ``verify=None`` (the default) checks jpeg/png samples, where
the decode dwarfs the CRC (measured: within run-to-run noise), and not raw ones, where it cuts
reads by more than half (docs/RELIABILITY.md, "Checksums and packer verify"; ``benchmarks/verify_cost.py``).
:meth:`Store.records` always hands over the bytes as stored (``packer verify`` compares them
itself and reports, rather than raises).

The image reads refuse a text dataset with one line (:meth:`Store.require_images`): its samples are token ids,
read through ``readers.TokenDataset``.
"""

from __future__ import annotations

import math
import operator
import os
import re
from pathlib import Path
from typing import Any, ClassVar, Iterator, Sequence

import numpy as np

from ..checksums import CorruptSampleError, sample_checksum
from ..codecs import decode_into
from ..schema import Metadata, PackedFormatError

__all__ = ["Store", "Record", "Fault", "dataset_path", "checked_index", "local_path", "magic_mismatch", "SHARD_NAME", "refuse_other_pattern", "missing_dataset"]

#: One stored sample as a format hands it over: label, (C, H, W) shape, payload bytes.
#: The payload may be a view that is only valid until the next record is requested.
Record = tuple[int, tuple[int, int, int], "bytes | memoryview"]
#: A structure problem a format finds: ``(where, what)``, e.g. ``("shard shard-000001.tar", "holds 9 members, ...")``.
Fault = tuple[str, str]


#: A WebDataset shard file name pattern: one ``%d`` field, the .tar suffix (``train-%06d.tar``).
SHARD_NAME = re.compile(r"[^%/\\]*%0?\d*d[^%/\\]*\.tar")


def dataset_path(path: str | Path) -> Path:
    """The dataset at ``path``: a WebDataset destination given as its shard pattern, as
    ``packer convert`` takes it (``out/train-%06d.tar``), is its folder (``out``); a ``file://``
    URL, as ``packer convert`` writes to, is its local path."""
    p = Path(local_path(path))
    return p.parent if SHARD_NAME.fullmatch(p.name) and not p.exists() else p


#: A brace pattern of shards, as webdataset expands it and ``packer convert`` prints it: ``shard-{000000..000008}.tar``.
_BRACES = re.compile(r"\{[^{}]*\.\.[^{}]*\}|\{[^{}]*,[^{}]*\}")


def missing_dataset(path: Path) -> FileNotFoundError:
    """The error for a ``path`` where no packed dataset is; a brace pattern of shards (what
    ``packer convert`` prints for webdataset) says to open their folder, or stream the pattern."""
    if _BRACES.search(path.name) and path.parent.is_dir():
        folder = str(path.parent)
        return FileNotFoundError(f"{path}: a brace pattern of shards, which webdataset expands; a packer dataset is opened by its "
                                 f"folder: readers.ShardDataset({folder!r}) (or open_dataset({folder!r})), or stream the pattern "
                                 f"with readers.StreamingShards({str(path)!r})")
    return FileNotFoundError(f"{path}: no such packed dataset")


def refuse_other_pattern(given: str | Path, folder: Path, shards: Sequence[str]) -> None:
    """A shard pattern given for a dataset (``out/val-%06d.tar``, as ``packer convert`` takes
    DST) must name its shards: ``out/bogus-%06d.tar`` read every shard of ``out`` as if it did."""
    name = Path(local_path(given)).name
    if Path(local_path(given)) != folder and SHARD_NAME.fullmatch(name) and shards and name % 0 != shards[0]:
        raise PackedFormatError(f"{given}: names no shard of the dataset in {folder} (its shards: {shards[0]} to {shards[-1]}); "
                                "give the folder, or the pattern its shards follow")


def checked_index(index: Any, n: int, owner: str, out_of_range: str) -> int:
    """``index`` (negative: from the end) as an ``int`` in ``0..n-1``; a ``TypeError`` naming
    ``owner``'s indices when it is no integer, an ``IndexError`` saying ``out_of_range`` when it
    is outside (the datasets' and ``TokenDataset``'s blocks' one check)."""
    try:
        i = operator.index(index)
    except TypeError:
        raise TypeError(f"{owner} indices must be integers, not {type(index).__name__}") from None
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError(out_of_range)
    return i


def local_path(value: str | Path) -> str | Path:
    """The local path of a ``file://`` URL, read as fsspec (which ``packer convert`` writes
    through) reads it: the rest of the URL, as it is (``%06d`` is a shard pattern, not an
    escape); anything else as it is."""
    if isinstance(value, str) and value[:7].lower() == "file://":
        rest = value[7:]
        return rest[len("localhost"):] if rest[:10].lower() == "localhost/" else rest  # file://localhost/x is /x (RFC 8089)
    return value


def magic_mismatch(path: Path, magic: bytes, readable: str, expected: str) -> str | None:
    """Why the file ``path`` is not ``expected`` (``"a packer blob"``) from its first bytes,
    which must be ``magic``; or that it is not ``readable`` (``"a readable blob"``); ``None`` if it is."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(magic))
    except OSError as exc:
        return f"not {readable} ({exc.strerror or type(exc).__name__})"
    return None if head == magic else f"not {expected} (starts with {head!r}, expected {magic!r})"


class Store:
    """Read access to one packed dataset; picklable, opens storage lazily per process."""

    format_name: ClassVar[str] = ""
    #: The format's name in messages: "a packer HDF5 dataset, not LMDB".
    label: ClassVar[str] = ""
    #: Whether :meth:`pixel_arrays` may give the samples as one array (a device-side gather).
    has_pixel_arrays: ClassVar[bool] = False
    #: Whether reads serialise on a process-wide lock (h5py's): a second filling thread only adds
    #: contention (``readers.Loader`` then uses one).
    serial_reads: bool = False
    #: Whether the dataset's bytes are a copy in memory rather than read from storage.
    in_memory: bool = False

    def __init__(self, path: str | Path, *, verify: bool | None = None) -> None:
        self.path = self._locate(path)
        self._payload_offsets_cache: np.ndarray | None = None
        self._crcs: np.ndarray | None = None  # the stored checksums, loaded on the first verified read
        self._names: list[str] | None = None  # the source names, loaded on the first source_name()
        self.meta: Metadata = self._read_metadata()
        #: Whether image reads check each sample's stored checksum (see the module docstring).
        self.verify: bool = self._resolve_verify(verify)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_crcs"] = None  # each process loads its own (a spawned worker is not sent them)
        state["_names"] = None
        return state

    # -- what a format supplies ---------------------------------------------------------
    def _locate(self, path: str | Path) -> Path:
        """The dataset's :attr:`path` (a shard pattern: its folder), which must exist and look like
        this format; a store of a dataset at a URL (``readers/formats/remote.py``) keeps the URL."""
        located = dataset_path(path)
        if not located.exists():
            raise missing_dataset(located)
        reason = self.mismatch(located)
        if reason is not None:
            raise PackedFormatError(f"{located}: {reason}")
        return located

    @classmethod
    def mismatch(cls, path: Path) -> str | None:
        """Why ``path`` (which exists) does not look like this format, from its name or first
        bytes, as one clause (``"not an LMDB dataset (no data.mdb inside)"``); ``None`` when it does."""
        raise NotImplementedError

    @classmethod
    def recognises(cls, path: Path) -> bool:
        """Whether ``path`` (which exists) looks like this format (:meth:`mismatch` finds nothing)."""
        return cls.mismatch(path) is None

    def _read_metadata(self) -> Metadata:
        raise NotImplementedError

    def _records(self, indices: Sequence[int]) -> Iterator[Record]:
        """Yield the stored record of each (already checked) index, in order."""
        raise NotImplementedError

    def stored_checksums(self) -> np.ndarray | None:
        """The per-sample checksums stored with the data (``readers/checksums.py``), or ``None``.

        One uint32 per sample, in index order; ``None`` when the metadata records no checksum.
        """
        return None

    def source_names(self) -> list[str] | None:
        """Each sample's source name, in index order (``readers/formats/names.py``), or ``None``
        for a dataset written before names were recorded. Read from storage on every call."""
        return None

    def source_name(self, index: int) -> str | None:
        """The input sample ``index`` was converted from, relative to the source, or ``None``
        when the dataset records no names (the names are loaded once, on the first call)."""
        index = int(self.check_indices([index])[0])
        if self._names is None:
            self._names = self.source_names()
            if self._names is None:
                return None
        return self._names[index]

    def _fill_raw(self, indices: np.ndarray, out: np.ndarray, labels: np.ndarray) -> None:
        """Fill ``out`` (N, C, H, W) and ``labels`` (N,) for fixed-shape raw storage."""
        for j, (label, shape, payload) in enumerate(self._records(indices)):
            out[j] = self.raw_view(payload, shape, int(indices[j]))
            labels[j] = label

    def _payload_offsets(self) -> np.ndarray:
        """:meth:`payload_offsets`, uncached: here one pass over every record (formats with an
        index of their payloads override it)."""
        n = len(self)
        lengths = np.fromiter((len(payload) for _label, _shape, payload in self._records(range(n))), np.int64, n)
        return np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths, dtype=np.int64)])

    def _read_stream(self, start: int, stop: int, out: np.ndarray) -> None:
        """:meth:`read_stream` of a checked range: here the payloads it touches, one by one
        (formats that store the stream as one array override it with one slice)."""
        offsets = self.payload_offsets()
        first = int(np.searchsorted(offsets, start, "right")) - 1
        last = int(np.searchsorted(offsets, stop, "left"))
        at = 0
        for i, (_label, _shape, payload) in zip(range(first, last), self._records(range(first, last))):
            begin, end = int(offsets[i]), int(offsets[i + 1])
            lo, hi = max(start, begin) - begin, min(stop, end) - begin
            out[at : at + hi - lo] = np.frombuffer(payload, np.uint8, hi - lo, lo)
            at += hi - lo

    # -- what tools ask of any format -----------------------------------------------------
    def records(self, indices: Sequence[int]) -> Iterator[Record]:
        """The stored record ``(label, (C, H, W) shape, payload bytes)`` of each index, in order,
        exactly as stored (no decoding; a text document's payload is its token ids' bytes).

        Indices are checked first (negative ones count from the end). A payload may be a view
        valid only until the next record is requested: copy it to keep it.
        """
        return self._records(self.check_indices(indices))

    def pixel_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """This process's (N, C, H, W) pixel array and (N,) labels over the stored bytes, where the
        format has them (:attr:`has_pixel_arrays`) and the samples are fixed-shape raw; else ``None``."""
        return None

    def structure_faults(self) -> Iterator[Fault]:
        """Problems with the format's own structure that opening the store does not check, as
        ``(where, what)`` pairs (``packer verify`` reports them). Here: none to check."""
        return iter(())

    #: The names a folder dataset of this format always holds (a format stored as one file: none).
    own_names: ClassVar[frozenset[str]] = frozenset()

    def foreign_content(self) -> list[str]:
        """What the dataset holds that its format did not write, sorted: names in its folder (a
        user's notes put there); a format stored as one file that others can add to (HDF5) names
        what was added inside. What ``--overwrite`` must not delete."""
        listed = self._folder_names()
        if listed is None:
            return []
        names = set(listed) - self.own_names - set(self._written_names())
        return sorted(name for name in names if name != ".DS_Store" and not name.startswith(".nfs"))  # (Finder's, NFS's own)

    def _folder_names(self) -> list[str] | None:
        """The names in the dataset's folder; ``None`` for a dataset stored as one file (or a
        folder that cannot be listed: one at an http(s) URL)."""
        return os.listdir(self.path) if self.path.is_dir() else None

    def _written_names(self) -> list[str]:
        """Names beside :attr:`own_names` that this dataset's conversion wrote (its shards)."""
        return []

    def where(self, index: int) -> str:
        """Where sample ``index`` is, for messages: ``"sample 12"`` (formats with several files add which)."""
        return f"sample {index}"

    def payload_offsets(self) -> np.ndarray:
        """``(N + 1,)`` int64: payload ``i`` is bytes ``offsets[i]:offsets[i + 1]`` of the
        *payload stream*, every stored payload back to back in index order (for a text dataset,
        the flat token stream's bytes). Worked out once per store, then kept."""
        if self._payload_offsets_cache is None:
            offsets = np.asarray(self._payload_offsets(), np.int64)
            if offsets.shape != (len(self) + 1,) or (len(self) and (offsets[0] != 0 or np.any(np.diff(offsets) < 0))):
                raise PackedFormatError(f"{self.path}: the payload offsets are not {len(self) + 1} increasing values from 0: the dataset is corrupt")
            self._payload_offsets_cache = offsets
        return self._payload_offsets_cache

    def read_stream(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Bytes ``start:stop`` of the payload stream (:meth:`payload_offsets`) into the uint8
        array ``out`` (or a new one), across payload boundaries."""
        total = int(self.payload_offsets()[-1])
        if not 0 <= start <= stop <= total:
            raise IndexError(f"byte range {start}:{stop} is outside the {total} bytes of {self.path}'s payloads")
        if out is None:
            out = np.empty(stop - start, np.uint8)
        elif out.dtype != np.uint8 or out.shape != (stop - start,):
            raise ValueError(f"out must be a uint8 array of shape ({stop - start},), got {out.dtype} {out.shape}")
        self._read_stream(start, stop, out)
        return out

    def require_images(self) -> None:
        """Raise :class:`PackedFormatError` (one line) unless the dataset holds images."""
        if self.meta.kind != "image":
            raise PackedFormatError(
                f"{self.path}: a {self.meta.kind} dataset ({self.meta.count:,} documents of {self.meta.dtype} token ids), not images: "
                "read it with readers.TokenDataset(path) (or readers.open_dataset(path))"
            )

    # -- reading ------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.meta.count

    def read(self, index: int) -> tuple[np.ndarray, int]:
        """One sample as a new (C, H, W) uint8 array and its label."""
        self.require_images()
        i = self.check_index(index)
        if self.meta.encoding == "raw" and self.meta.fixed_shape:  # the format's fast fill, straight into the array
            images, labels = self.read_batch([i])
            return images[0], int(labels[0])
        for label, shape, payload in self._records([i]):
            if self.verify:
                self.check_sample(i, label, shape, payload)
            image = np.empty(shape, np.uint8)
            self.decode(payload, image, i)
            return image, label
        raise PackedFormatError(f"{self.path}: sample {i} is missing")  # pragma: no cover

    def read_batch(self, indices: Sequence[int], out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Samples into one ``(N, C, H, W)`` uint8 array (``out`` or a new one) plus int64 labels.

        Needs a fixed sample shape (:attr:`Metadata.fixed_shape`); :meth:`read_samples` works
        for any shapes.
        """
        self.require_images()
        if not self.meta.fixed_shape:
            raise PackedFormatError(
                f"{self.path}: samples have different shapes, so they cannot fill one batch array: "
                "read them one at a time (dataset[i], or the store's read_samples()), or convert with --resize-mode center-crop, pad or stretch"
            )
        idx = self.check_indices(indices)
        shape = (len(idx), *self.meta.shape)  # type: ignore[misc]
        if out is None:
            out = np.empty(shape, np.uint8)
        elif out.shape != shape or out.dtype != np.uint8:
            raise ValueError(f"out must be a uint8 array of shape {shape}, got {out.dtype} {out.shape}")
        labels = np.empty(len(idx), np.int64)
        if self.meta.encoding == "raw":
            self._fill_raw(idx, out, labels)
            if self.verify:
                self.check_rows(idx, out, labels)
        else:
            for j, (label, shape, payload) in enumerate(self._records(idx)):
                if self.verify:
                    self.check_sample(int(idx[j]), label, shape, payload)
                self.decode(payload, out[j], int(idx[j]))
                labels[j] = label
        return out, labels

    def read_samples(self, indices: Sequence[int]) -> list[tuple[np.ndarray, int]]:
        """Samples as separate (C, H, W) arrays: works for variable shapes too."""
        self.require_images()
        idx = self.check_indices(indices)
        samples = []
        for i, (label, shape, payload) in zip(idx, self._records(idx)):
            if self.verify:
                self.check_sample(int(i), label, shape, payload)
            image = np.empty(shape, np.uint8)
            self.decode(payload, image, int(i))
            samples.append((image, label))
        return samples

    # -- integrity on read ---------------------------------------------------------------
    def _resolve_verify(self, verify: bool | None) -> bool:
        if verify is not None and not isinstance(verify, (bool, np.bool_)):  # ("no" is truthy: it turned checking on)
            raise TypeError(f"verify must be True, False or None, got {verify!r}")
        if verify is None:
            return bool(self.meta.checksum) and self.meta.encoding != "raw"
        if verify and not self.meta.checksum:
            raise PackedFormatError(
                f"{self.path}: verify=True, but the dataset records no checksums (written by an older packer): "
                "convert it again, or read it with verify=False"
            )
        return bool(verify)

    def check_sample(self, index: int, label: int, shape: Sequence[int], payload: bytes | memoryview | np.ndarray) -> None:
        """Raise :class:`CorruptSampleError` unless sample ``index``'s bytes (``payload``, as
        stored, C-contiguous) match its stored checksum."""
        if self._crcs is None:
            crcs = self.stored_checksums()
            if crcs is None:  # pragma: no cover - refused on open
                raise PackedFormatError(f"{self.path}: no checksums stored to verify against")
            self._crcs = crcs
        stored, computed = int(self._crcs[index]), sample_checksum(label, shape, payload)
        if computed != stored:
            raise CorruptSampleError.mismatch(str(self.path), int(index), self.where(int(index)), stored, computed)

    def check_rows(self, indices: np.ndarray, out: np.ndarray, labels: np.ndarray) -> None:
        """:meth:`check_sample` of each raw row of a filled batch (the rows are the payloads)."""
        shape = out.shape[1:]
        for j, i in enumerate(indices.tolist()):
            row = out[j] if out[j].flags.c_contiguous else np.ascontiguousarray(out[j])
            self.check_sample(i, int(labels[j]), shape, row)

    # -- helpers ------------------------------------------------------------------------
    def decode(self, payload: bytes | memoryview, out: np.ndarray, index: int) -> None:
        """Write one stored payload into ``out`` (C, H, W): a copy for raw, a decode otherwise."""
        if self.meta.encoding == "raw":
            out[...] = self.raw_view(payload, out.shape, index)
            return
        try:
            decode_into(payload, out)
        except PackedFormatError as exc:
            raise PackedFormatError(f"{self.path}: sample {index}: {exc}") from None

    def raw_view(self, payload: bytes | memoryview, shape: Sequence[int], index: int) -> np.ndarray:
        expected = math.prod(shape)
        if len(payload) != expected:
            raise PackedFormatError(
                f"{self.path}: sample {index} has {len(payload)} bytes, expected {expected} for shape "
                f"{tuple(shape)}: the file is corrupt"
            )
        return np.frombuffer(payload, np.uint8).reshape(shape)

    def check_index(self, index: int) -> int:
        n = len(self)
        return checked_index(index, n, "dataset", f"index {index} is out of range for a dataset of {n} samples")

    def check_indices(self, indices: Sequence[int]) -> np.ndarray:
        given = np.asarray(indices)
        if given.size and not np.issubdtype(given.dtype, np.integer):  # 1.7 read sample 1; a boolean mask, samples 0 and 1
            raise TypeError(f"indices must be integers, got {given.dtype} ({given.reshape(-1)[0].item()!r} first)")
        idx = np.array(given, dtype=np.int64).reshape(-1)
        n = len(self)
        idx[idx < 0] += n
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = next(int(i) for i in np.asarray(indices).reshape(-1) if not -n <= int(i) < n)
            raise IndexError(f"index {bad} is out of range for a dataset of {n} samples")
        return idx
