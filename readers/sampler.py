"""``ResumableSampler``: the epoch plan (:mod:`readers.epoch`) as a ``sampler=`` for a plain ``DataLoader``.

A drop-in replacement for ``torch.utils.data.DistributedSampler`` (``set_epoch``, ``rank``,
``world_size``, equal sample counts on every rank) that also resumes mid-epoch, exactly and
elastically: the state is the position in the epoch's global order, so a job restarted with
another number of ranks, DataLoader workers or another batch size reads each remaining sample
of the epoch once. The same plan drives :class:`~readers.loader.Loader`: for the same settings
the sampler yields the indices of the Loader's batches, in order.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterator

from torch.utils.data import IterableDataset, Sampler

from .epoch import EpochCursor, EpochPlan, dataset_fingerprint, follow_epoch, position_state, read_position_state, resolve_rank, whole_number

__all__ = ["ResumableSampler"]


class ResumableSampler(Sampler[int]):
    """This rank's dataset indices of each epoch, resumable from a rank-independent state.

    ``DataLoader(ds, batch_size=B, sampler=ResumableSampler(ds, B), num_workers=...)``: give
    the sampler the DataLoader's ``batch_size`` (its steps are ``batch_size * world_size``
    positions of the epoch's global order) and leave the DataLoader's ``drop_last`` off (use
    the sampler's). ``data_source`` is the dataset (its packer metadata also makes the
    fingerprint a resume is checked against) or its length.

    * Order: a permutation drawn from ``(seed, epoch)`` when ``shuffle``; call :meth:`set_epoch`
      before each epoch. Rank ``r`` of ``world_size`` (default: from ``torch.distributed``, with
      a warning when it is not initialised but the environment says ``WORLD_SIZE > 1``) takes
      every ``world_size``-th position from ``r``.
    * Equal steps on every rank, so DDP never waits on a rank with a batch fewer: without
      ``drop_last`` the last positions are padded (the epoch's first samples repeated, at most
      ``world_size - 1``) to the same count on every rank; with ``drop_last`` the tail that does
      not fill a whole step (``batch_size * world_size``) is dropped. Settings whose epoch would
      have no index on a rank (no samples, or ``drop_last`` dropping them all) are refused.
    * Resume: the DataLoader fetches ahead of the loop (workers, prefetching), so the sampler
      cannot know what the loop consumed: pass it, ``state_dict(batches, loader=loader)`` with
      the batches the DataLoader yielded in this iteration (its batch size and ``drop_last`` checked). The
      state ``{epoch, samples_consumed, seed, shuffle, dataset}`` is the same on every rank that
      stepped together and is interchangeable with
      :meth:`readers.Loader.state_dict`'s. After :meth:`load_state_dict` the next iteration yields
      the rest of that epoch, with any ``world_size``, ``batch_size`` or worker count.
    """

    def __init__(
        self,
        data_source: Any,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if isinstance(data_source, IterableDataset):
            raise TypeError(f"ResumableSampler: {type(data_source).__name__} is an IterableDataset, which splits itself across "
                            "ranks and workers: give it to the DataLoader without a sampler")
        if isinstance(data_source, int) and not isinstance(data_source, bool):
            length = data_source
        elif hasattr(data_source, "__len__"):
            length = len(data_source)
        else:
            raise TypeError(f"ResumableSampler needs a sized dataset or its length, got {type(data_source).__name__}")
        rank, world_size = resolve_rank(rank, world_size, "ResumableSampler")
        self.plan = EpochPlan(int(length), batch_size, shuffle, seed, drop_last, rank, world_size)  # (it checks the flags)
        self.plan.refuse_empty("ResumableSampler")
        self._fingerprint = dataset_fingerprint(data_source, length)
        self._data_source = data_source
        self._cursor = EpochCursor()
        self._started: tuple[int, int] | None = None  # (epoch, position) of the latest iteration
        self._chosen, self._repeats = False, 0  # set_epoch (or a state loaded) since it; iterations repeating its epoch

    batch_size = property(lambda self: self.plan.batch_size, doc="Samples per batch (the DataLoader's).")
    shuffle = property(lambda self: self.plan.shuffle, doc="Whether each epoch's order is a permutation.")
    seed = property(lambda self: self.plan.seed, doc="The seed of every epoch's permutation.")
    drop_last = property(lambda self: self.plan.drop_last, doc="Whether the tail short of a whole step is dropped.")
    rank = property(lambda self: self.plan.rank, doc="This process's rank.")
    world_size = property(lambda self: self.plan.world_size, doc="How many ranks share each epoch.")
    num_replicas = world_size  # DistributedSampler's name

    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration follows."""
        return self._cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next iteration; a resume position loaded for another epoch is dropped."""
        self._cursor.set_epoch(epoch)
        self._chosen = True

    def _start(self) -> int:
        return self._cursor.position or 0

    def __len__(self) -> int:
        """Indices the next iteration yields on this rank (the rest of the epoch after a resume)."""
        return self.plan.samples(self._start())

    def __iter__(self) -> Iterator[int]:
        start, self._cursor.position = self._start(), None  # a resume applies to one iteration
        repeat = self.shuffle and self._started == (self.epoch, start) == (self.epoch, 0) and not self._chosen
        self._repeats = self._repeats + 1 if repeat else 0
        # its passes run in the DataLoader's hands, so it cannot move on by itself: it says so, once (at the
        # third: a look at the order before the epoch is no repeat)
        if self._repeats == 2:
            warnings.warn(f"ResumableSampler: epoch {self.epoch}'s order a third time: no set_epoch between its iterations, "
                          "so each repeats it; call sampler.set_epoch(epoch) before each epoch, as with DistributedSampler",
                          stacklevel=2)
        self._started, self._chosen = (self.epoch, start), False
        follow_epoch(self._data_source, self.epoch)
        return iter(self.plan.rank_indices(self.epoch, start).tolist())

    def state_dict(self, batches: int, *, loader: Any = None, batch_size: int | None = None) -> dict[str, Any]:
        """The position after the DataLoader yielded ``batches`` batches of the current iteration
        (counted from where it started: after a resume, from the resume position). After the
        iteration's last batch: the next epoch, nothing of it consumed, as
        :meth:`readers.Loader.state_dict` says, so a checkpoint saved at an epoch's last step
        resumes with the next one.

        ``loader``, the DataLoader (or ``batch_size``, its ``batch_size``), is required and
        checked: batches of another size than the sampler's are other positions, and the
        DataLoader's own ``drop_last`` leaves out a last batch the sampler counts; either way
        the resume would skip or repeat samples without a word (a migrant's walkthrough)."""
        batches = whole_number(batches, "state_dict: batches", "a count of batches (an int >= 0)")
        if loader is not None:
            if batch_size is not None:
                raise ValueError("state_dict: pass loader= or batch_size=, not both")
            batch_size = getattr(loader, "batch_size", None)
            if getattr(loader, "drop_last", False) and not self.drop_last:
                raise ValueError("state_dict: the DataLoader has drop_last=True, which the sampler cannot see: give "
                                 "ResumableSampler drop_last=True instead and leave the DataLoader's off")
        if batch_size is None:
            raise ValueError("state_dict: pass the DataLoader, state_dict(batches, loader=loader) (or batch_size=loader.batch_size): "
                             "its batches are counted in the sampler's steps only if they are the same size")
        if batch_size != self.batch_size:
            raise ValueError(f"state_dict: the DataLoader's batch_size={batch_size}, but this sampler's is {self.batch_size}: "
                             "give ResumableSampler the DataLoader's batch_size, or its batches are not the sampler's steps")
        if self._started is None or self._started[0] != self.epoch:  # no iteration of this epoch yet
            if batches:
                raise ValueError(f"state_dict: batches={batches}, but no iteration of epoch {self.epoch} has started")
            return position_state(self.plan, self.epoch, self._start(), self._fingerprint)
        epoch, start = self._started
        if batches > self.plan.steps(start):
            raise ValueError(f"state_dict: batches={batches} is more than the {self.plan.steps(start)} batches this iteration has")
        position = self.plan.position(start, batches)
        if position >= self.plan.length:
            return position_state(self.plan, epoch + 1, 0, self._fingerprint)
        return position_state(self.plan, epoch, position, self._fingerprint)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration yield the rest of ``state``'s epoch (from :meth:`state_dict` or
        ``Loader.state_dict``); another dataset, ``seed`` or ``shuffle`` raises :class:`~readers.epoch.ResumeError`."""
        epoch, consumed = read_position_state(state, self.plan, self._fingerprint, "sampler")
        self._cursor.resume(epoch, consumed)
        self._chosen = True
        self._started = None

    def __repr__(self) -> str:
        return (
            f"ResumableSampler({self.plan.length} samples, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"seed={self.seed}, drop_last={self.drop_last}, rank={self.rank}/{self.world_size}, epoch={self.epoch})"
        )

