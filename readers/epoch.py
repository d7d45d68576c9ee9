"""The epoch plan: which samples (or shards) each distributed rank reads in each epoch, in what order.

One owner for what :class:`~readers.loader.Loader`, :class:`~readers.sampler.ResumableSampler`
and :class:`~readers.webdataset.StreamingShards` need:

* :func:`resolve_rank`: ``rank``/``world_size`` from the arguments, else from ``torch.distributed``
  when it is initialised, else one process (warned when the environment says ``WORLD_SIZE > 1``);
  validated. :func:`whole_number` checks every seed, epoch and count at the API boundary.
* :class:`EpochPlan` (map-style, for ``Loader`` and ``ResumableSampler``): one global order per
  epoch, a permutation drawn from ``(seed, epoch)``, read in steps of ``batch_size *
  world_size`` positions split across ranks, so that every rank gets the same number of
  batches (a short last step padded, or dropped with ``drop_last``). A position in it (the
  samples the whole job has consumed) does not depend on the world size: the rest of an epoch
  can be read with any world size or batch size, each sample once.
* The saved state of a position (:func:`position_state`, :func:`read_position_state`): tiny,
  rank-independent, JSON-safe ``{epoch, samples_consumed, seed, shuffle, dataset}``, with the
  dataset's fingerprint (:func:`dataset_fingerprint`); a state that cannot continue here raises
  :class:`ResumeError` naming what differs.
* The streaming plan, for ``StreamingShards``, is :mod:`readers.shard_plan` (it uses the
  checks and seeds here). :meth:`EpochPlan.refuse_empty` refuses an epoch with no batch.
* :class:`EpochCursor` and :func:`check_settings`: the resume bookkeeping all share (the
  epoch the next iteration follows, a resume position that ``set_epoch`` to another epoch
  drops, and the refusal of a saved state whose order-deciding settings differ).

Every plan is a pure function of its settings and the epoch: the same on every process.
"""

from __future__ import annotations

import hashlib
import numbers
import os
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np
import torch

__all__ = [
    "EpochItems",
    "EpochPlan",
    "EpochCursor",
    "ResumeError",
    "resolve_rank",
    "distributed_rank",
    "check_settings",
    "check_fingerprint",
    "dataset_fingerprint",
    "subset_of",
    "position_state",
    "read_position_state",
    "check_batch_size",
    "whole_number",
    "mix_seed",
]


def distributed_rank() -> tuple[int, int]:
    """``(rank, world_size)`` of ``torch.distributed`` when it is initialised, else ``(0, 1)``."""
    if _group_initialised():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _group_initialised() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def resolve_rank(rank: int | None, world_size: int | None, owner: str = "reader") -> tuple[int, int]:
    """``(rank, world_size)``: each given one as is, a missing one from :func:`distributed_rank`.

    Warns (``UserWarning``, shown once per calling line by Python's default filter) when a
    missing one comes from a process group not yet initialised while the environment says
    ``WORLD_SIZE > 1`` (``torchrun`` sets it): ``owner`` would read as rank 0 on every process
    (of one process: the whole dataset), unlike what the launcher meant. Raises ``ValueError``
    unless both are integers, ``world_size >= 1`` and ``0 <= rank < world_size``, and for a
    ``world_size`` above 1 without ``rank`` or a process group to give it."""
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise ValueError(f"{name} must be an integer, got {value!r}")  # (0.5 read as rank 0, '1' a TypeError)
    if rank is None and world_size is not None and world_size > 1 and not _group_initialised():
        raise ValueError(f"world_size={world_size} without rank= and no torch.distributed process group: every process would "
                         "read as rank 0 (the same share, the others' never read); pass rank= too, or neither under torch.distributed")
    defaulted = "" if world_size is not None else " (world_size not given: torch.distributed's, or 1 without a process group)"
    if rank is None or world_size is None:
        dist_rank, dist_size = distributed_rank()
        rank = dist_rank if rank is None else rank
        world_size = dist_size if world_size is None else world_size
        launched = os.environ.get("WORLD_SIZE", "").strip()  # a launcher's (torchrun sets it)
        if launched.isdigit() and int(launched) > 1 and not _group_initialised():
            whole = " (the whole dataset, on every process)" if world_size == 1 else ", on every process"
            warnings.warn(
                f"{owner}: the environment says WORLD_SIZE={launched} (RANK={os.environ.get('RANK', '?')}), but no "
                f"torch.distributed process group is initialised, so it reads as rank {rank} of {world_size}{whole}; "
                "call torch.distributed.init_process_group() before creating it, or pass rank= and world_size=",
                UserWarning, stacklevel=3)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} and world_size={world_size}{defaulted}: need world_size >= 1 and 0 <= rank < world_size")
    return int(rank), int(world_size)


def check_batch_size(batch_size: Any) -> int:
    """``batch_size`` as an ``int`` (a numpy integer too, as ``seed`` and ``set_epoch`` take it:
    ``np.int64(8)`` was refused as not a positive integer); raises ``ValueError`` unless it is one >= 1."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    return int(batch_size)


def whole_number(value: Any, name: str, what: str = "an integer >= 0") -> int:
    """``value`` as an ``int`` when it is an integer >= 0 (a numpy integer too, never a bool);
    else a ``TypeError`` (not an integer) or ``ValueError`` (negative) saying ``name must be what``."""
    return _integer_from(value, value, 0, f"{name} must be {what}")


def positive_number(value: Any, name: str) -> int:
    """``value`` as an ``int`` when it is an integer >= 1 (a numpy integer, or a float of a whole
    number such as ``1e4`` or ``cores / 2``, too; never a bool, or a float such as 2.5, which would
    be cut silently); else a ``TypeError`` or ``ValueError``."""
    number = int(value) if isinstance(value, float) and value.is_integer() else value
    return _integer_from(number, value, 1, f"{name} must be a positive integer")


def _integer_from(number: Any, given: Any, minimum: int, must: str) -> int:
    """``number`` as an ``int`` of at least ``minimum``, else the error ``must``, naming ``given``."""
    if isinstance(number, bool) or not isinstance(number, numbers.Integral):
        raise TypeError(f"{must}, got {given!r}")
    if number < minimum:
        raise ValueError(f"{must}, got {given!r}")
    return int(number)


def flag(value: Any, name: str) -> bool:
    """``value`` as a ``bool`` when it is one (a numpy bool, or the integer 0 or 1, too); else a
    ``TypeError``: a string such as ``"false"`` from a config file is truthy, and would turn the
    option on."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def mix_seed(*values: int) -> int:
    """One 63-bit seed from several integers (seed, epoch, rank, worker), the same on every process."""
    seed = 0x9E3779B97F4A7C15
    for value in values:
        seed = (seed * 1_000_003 + int(value)) % (1 << 63)
    return seed


class ResumeError(ValueError):
    """A saved reading state that cannot continue here: a state of another dataset, one saved
    with other order-deciding settings, or something that is not such a state (one line says which)."""


def check_settings(state: Mapping[str, Any], mine: Mapping[str, Any], owner: str) -> None:
    """Refuse a saved ``state`` whose plan-deciding settings differ from ``mine`` (keys the
    state lacks are not checked): a :class:`ResumeError` names the first one that differs."""
    for key, value in mine.items():
        if key in state and state[key] != value:
            raise ResumeError(
                f"load_state_dict: the state was saved with {key}={state[key]!r}, this {owner} has {key}={value!r}; "
                f"resume with the same {key}"
            )


@runtime_checkable
class EpochItems(Protocol):
    """A map-style dataset whose index names something made from its samples, which may depend
    on the epoch (:class:`~readers.TokenDataset`: blocks, or random windows drawn per epoch): the
    Loader and :class:`~readers.ResumableSampler` put :attr:`item_identity` in a resume state's
    fingerprint and call :meth:`set_epoch` at each iteration (:func:`follow_epoch`)."""

    @property
    def item_identity(self) -> str:
        """What an index names (``"blocks of 1024 tokens, consecutive"``)."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch``'s items from here on."""


def dataset_fingerprint(dataset: Any, length: int) -> dict[str, Any]:
    """What identifies a dataset's samples by index, JSON-safe: ``samples`` (its length) and, for
    a packer dataset, its metadata's ``checksums_sha256`` (its samples' content, labels and order:
    a conversion of the same source again, to any format or on another node, continues a state),
    or, in a dataset written before that field, its ``source`` and ``created`` (the conversion
    that wrote it); and ``items``, where an index names something made from the samples (a
    :class:`~readers.TokenDataset`'s blocks: their size, and random windows' seed), its ``item_identity``."""
    fingerprint: dict[str, Any] = {"samples": int(length)}
    if isinstance(dataset, EpochItems):
        fingerprint["items"] = str(dataset.item_identity)
    meta = getattr(dataset, "meta", None)
    digest = getattr(meta, "checksums_sha256", None)
    for key in ("checksums_sha256",) if isinstance(digest, str) and digest else ("source", "created"):
        value = getattr(meta, key, None)
        if isinstance(value, str) and value:
            fingerprint[key] = value
    return fingerprint


def subset_of(indices: Any, length: int, owner: str) -> tuple[np.ndarray, str]:
    """``indices`` (dataset indices in any order, repeats allowed: a split, an oversampling) checked
    against a dataset of ``length`` samples, as int64, and their digest with ``length``, the
    fingerprint's ``subset`` (a state saved over other indices, or the same indices of a dataset of
    another length, is refused); ``ValueError`` in one line otherwise."""
    array = np.asarray(indices)
    if array.dtype == np.bool_:
        raise ValueError(f"{owner}: indices is a boolean mask: pass the indices it selects, numpy.flatnonzero(mask)")
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{owner}: indices must be a 1-D sequence of integer dataset indices, got {array.dtype} of shape {array.shape}")
    if not array.size:
        raise ValueError(f"{owner}: indices is empty, so every epoch would yield no batch")
    bad = np.flatnonzero((array < 0) | (array >= length))
    if bad.size:
        raise ValueError(f"{owner}: indices[{bad[0]}] = {array[bad[0]]} is outside the dataset's 0..{length - 1}"
                         + (f" ({bad.size} such indices)" if bad.size > 1 else ""))
    array = array.astype(np.int64)  # the digest covers the dataset's length too: the subset's count alone would not tell datasets apart
    return array, hashlib.sha256(np.append(np.int64(length), array).astype("<i8").tobytes()).hexdigest()[:16]


def follow_epoch(dataset: Any, epoch: int) -> None:
    """Tell an :class:`EpochItems` dataset (a :class:`~readers.TokenDataset`'s random windows) the
    epoch an iteration reads; other datasets are left alone."""
    if isinstance(dataset, EpochItems):
        dataset.set_epoch(epoch)


def check_fingerprint(saved: Any, mine: Mapping[str, Any], owner: str) -> None:
    """Refuse a state saved over another dataset: a :class:`ResumeError` names the first field of
    the fingerprint that differs (fields only one side has are not compared, but ``subset``: a
    state of a subset and one of the whole dataset never continue each other)."""
    if not isinstance(saved, Mapping):
        raise ResumeError(f"load_state_dict: the state's dataset fingerprint is {saved!r}, expected a mapping")
    if saved.get("subset") != mine.get("subset"):
        def what(fingerprint: Mapping[str, Any]) -> str:
            return f"the indices {fingerprint['subset']}" if "subset" in fingerprint else "the whole dataset"

        raise ResumeError(f"load_state_dict: the state is of other samples: it was saved over {what(saved)}, this {owner} reads {what(mine)}")
    for key, value in sorted(mine.items(), key=lambda item: item[0] != "items"):  # (what an index names decides the count)
        if key in saved and saved[key] != value:
            raise ResumeError(
                f"load_state_dict: the state is of another dataset: it was saved over {key}={saved[key]!r}, "
                f"this {owner} reads {key}={value!r}"
            )


def position_state(plan: "EpochPlan", epoch: int, consumed: int, fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """The saved state of a position in the global plan: rank-independent and JSON-safe."""
    return {
        "epoch": int(epoch),
        "samples_consumed": int(consumed),
        "seed": plan.seed,
        "shuffle": plan.shuffle,
        "dataset": dict(fingerprint),
    }


def read_position_state(state: Any, plan: "EpochPlan", fingerprint: Mapping[str, Any], owner: str) -> tuple[int, int]:
    """``(epoch, samples_consumed)`` of a state from :func:`position_state`, checked against
    ``plan`` and the dataset's fingerprint; any world size, batch size and ``drop_last`` may
    continue it. An older ``Loader`` state (``batches`` per rank with its ``batch_size`` and
    ``world_size``) is converted exactly: ``k`` batches on every rank are ``k * batch_size *
    world_size`` positions of the same global order. Anything else: one :class:`ResumeError`."""
    if not isinstance(state, Mapping) or "epoch" not in state:
        raise ResumeError(f"load_state_dict: {type(state).__name__} is not a saved {owner} state (no 'epoch')")
    if "skip" in state and "samples_consumed" not in state:  # (it was told of a shuffle or a field it lacks: the wrong fix)
        raise ResumeError(f"load_state_dict: a StreamingShards state (its 'skip'), not a {owner} state: it resumes the "
                          f"StreamingShards that saved it; a {owner} resumes from its own state_dict")
    check_settings(state, {"seed": plan.seed, "shuffle": plan.shuffle}, owner)
    check_fingerprint(state.get("dataset", {}), fingerprint, owner)
    if "samples_consumed" in state:
        consumed = state["samples_consumed"]
    elif {"batches", "batch_size", "world_size", "length"} <= state.keys():  # the format before the global plan
        check_fingerprint({"samples": state["length"]}, fingerprint, owner)
        saved = EpochPlan(int(state["length"]), int(state["batch_size"]), plan.shuffle, plan.seed,
                          bool(state.get("drop_last", False)), 0, int(state["world_size"]))
        if not 0 <= int(state["batches"]) <= len(saved):
            raise ResumeError(f"load_state_dict: batches={state['batches']} is outside 0..{len(saved)} for the saved settings")
        consumed = saved.position(0, int(state["batches"]))
    else:
        raise ResumeError(f"load_state_dict: the state has no 'samples_consumed' (nor an older state's 'batches'): not a saved {owner} state")
    if isinstance(consumed, bool) or not isinstance(consumed, numbers.Integral):
        raise ResumeError(f"load_state_dict: samples_consumed={consumed!r} is not a count of samples (an integer 0..{plan.length})")
    if not 0 <= consumed <= plan.length:
        raise ResumeError(f"load_state_dict: samples_consumed={consumed!r} is outside 0..{plan.length} for this {owner}")
    return state_epoch(state["epoch"]), int(consumed)


def state_epoch(epoch: Any) -> int:
    """A saved state's ``epoch``; a :class:`ResumeError` unless it is an integer >= 0."""
    try:
        return whole_number(epoch, "the state's epoch")
    except (TypeError, ValueError) as exc:
        raise ResumeError(f"load_state_dict: {exc}") from None


class EpochCursor:
    """The epoch the next iteration follows, and a resume position inside it (``None``: whole).

    ``set_epoch`` to another epoch drops the position (the next iteration is whole); a loaded
    state (its settings checked by :func:`check_settings`) sets both through :meth:`resume`."""

    __slots__ = ("epoch", "position")

    def __init__(self) -> None:
        self.epoch = 0
        self.position: Any = None

    def set_epoch(self, epoch: int) -> None:
        epoch = whole_number(epoch, "set_epoch: epoch")
        if epoch != self.epoch:
            self.position = None
        self.epoch = epoch

    def resume(self, epoch: int, position: Any) -> None:
        """Make the next iteration follow ``epoch`` from ``position`` (a loaded state, already checked)."""
        self.epoch = state_epoch(epoch)
        self.position = position


@dataclass(frozen=True)
class EpochPlan:
    """The batches of dataset indices rank ``rank`` of ``world_size`` reads in each epoch.

    One global order per epoch: a permutation drawn from ``(seed, epoch)`` when ``shuffle``, else
    index order, the same on every process whatever the world size. The job reads it front to
    back in *steps*: from a position ``start`` (samples of the order the job has consumed, 0 for
    a whole epoch), step ``s`` consumes the next ``batch_size * world_size`` positions, and rank
    ``r`` takes every ``world_size``-th of them from ``r`` (its batch of that step). A position is
    therefore rank-independent, and the rest of an epoch can be read with any world size or
    batch size: whatever the settings, the positions ``start..length`` are each read once.

    Every rank gets the same number of batches. The last positions, fewer than a whole step:
    without ``drop_last`` they make a shorter last step, padded (by repeating the epoch's first
    samples, at most ``world_size - 1``) so that every rank's last batch has the same size; with
    ``drop_last`` they are dropped. Either way the epoch is complete after the last step.
    """

    length: int
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size", check_batch_size(self.batch_size))  # (frozen: a numpy integer kept as an int)
        if self.length < 0:
            raise ValueError(f"length must be at least 0, got {self.length!r}")
        object.__setattr__(self, "seed", whole_number(self.seed, "seed"))  # a plain int: states are JSON
        object.__setattr__(self, "shuffle", flag(self.shuffle, "shuffle"))
        object.__setattr__(self, "drop_last", flag(self.drop_last, "drop_last"))
        resolve_rank(self.rank, self.world_size)

    @property
    def step_size(self) -> int:
        """Positions of the order one step consumes over all ranks: ``batch_size * world_size``."""
        return self.batch_size * self.world_size

    def steps(self, start: int = 0) -> int:
        """Batches per rank from position ``start`` to the end of the epoch (the same on every rank)."""
        full, tail = divmod(self.length - self._check_start(start), self.step_size)
        return full + (tail > 0 and not self.drop_last)

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return self.steps(0)

    def samples(self, start: int = 0) -> int:
        """Samples each rank reads from position ``start`` to the end of the epoch (padding included)."""
        full, tail = divmod(self.length - self._check_start(start), self.step_size)
        return full * self.batch_size + (0 if self.drop_last else -(-tail // self.world_size))

    def position(self, start: int, steps: int) -> int:
        """The position after ``steps`` steps from ``start``: ``length`` once the epoch's last step
        is done (its padding, or the tail ``drop_last`` drops, counts as read)."""
        return self.length if 0 < steps >= self.steps(start) else self._check_start(start) + steps * self.step_size

    def refuse_empty(self, owner: str) -> None:
        """Raise ``ValueError`` (why, and what would work) when an epoch yields no batch on a rank
        (then on every rank): no samples, or ``drop_last`` dropping all of them."""
        if len(self):
            return
        if not self.length:
            raise ValueError(f"{owner}: the dataset has no samples, so every epoch would yield no batch")
        fits = self.length // self.world_size  # the largest batch_size that makes one whole step
        hint = f" (here batch_size={fits} or less)" if fits else ""
        raise ValueError(
            f"{owner}: drop_last=True drops all {self.length} samples, fewer than one step of batch_size x world_size = "
            f"{self.batch_size} x {self.world_size}, so every rank would get no batch; make batch_size x world_size at most "
            f"{self.length}{hint}, or drop_last=False"
        )

    def order(self, epoch: int) -> np.ndarray:
        """The whole epoch's order (every rank's samples, before the split): a permutation of ``length``."""
        if self.shuffle:
            return np.random.default_rng([self.seed, epoch]).permutation(self.length)
        return np.arange(self.length, dtype=np.int64)

    def batches(self, epoch: int, start: int = 0) -> list[np.ndarray]:
        """This rank's batches of ``epoch`` from position ``start``: ``steps(start)`` arrays of indices."""
        order, size, w = self.order(epoch), self.batch_size, self.world_size
        full, tail = divmod(self.length - self._check_start(start), self.step_size)
        end = start + full * self.step_size
        out = list(order[start:end].reshape(full, size, w)[:, :, self.rank])
        if tail and not self.drop_last:  # a shorter last step, padded to a multiple of world_size
            last = order[end:]
            last = np.concatenate([last, np.resize(order, -tail % w)])
            out.append(last.reshape(-1, w)[:, self.rank])
        return out

    def rank_indices(self, epoch: int, start: int = 0) -> np.ndarray:
        """This rank's samples of ``epoch`` from ``start``, in order (its batches, concatenated)."""
        parts = self.batches(epoch, start)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def _check_start(self, start: int) -> int:
        if not 0 <= start <= self.length:
            raise ResumeError(f"samples_consumed={start} is outside 0..{self.length} for this dataset")
        return start
