"""CUDA host-to-device transfer: pinned buffers copied on a side stream, handed over safely.

:class:`CudaTransfer` is what :class:`~readers.loader.Loader` uses on a CUDA device;
:class:`CUDAPrefetcher` offers the same one-batch-ahead copying around any iterable of batches
(a plain torch DataLoader included). On the CPU both step aside, so one training loop runs
everywhere.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

__all__ = ["CUDAPrefetcher", "CudaTransfer", "resolve_device"]


class CudaTransfer:
    """Host -> device copies on a side stream, handed over with stream synchronisation."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def issue(self, tensors: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], Any]:
        """Start copying (pinned) host tensors; returns the device tensors and the done-event.

        Callable from any thread. Until the event has completed the host memory is still
        being read: wait on it (``event.synchronize()``) before writing into that memory.
        """
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            out = [t.to(self.device, non_blocking=True) for t in tensors]
            event = torch.cuda.Event()
            event.record(self.stream)
        return out, event

    def hand_over(self, tensors: Sequence[torch.Tensor], event: Any) -> None:
        """Make the consumer's current stream wait for the copy, and tell the caching allocator
        that the consumer's stream uses the tensors (they were allocated on the copy stream)."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)  # exactly this batch's copy (wait_stream would wait for later ones too)
        for t in tensors:
            t.record_stream(current)


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):  # torch's message lists every device type it knows
        raise ValueError(f"device={device!r}: the loader supports 'cpu' and 'cuda[:N]'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r}: CUDA is not available here; pass device=None or 'cpu'")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        raise ValueError(f"device={str(device)!r}: the loader supports 'cpu' and 'cuda[:N]'")
    return dev


class CUDAPrefetcher:
    """Wrap any iterable of batches (a :class:`Loader`, a torch DataLoader) to copy each batch to
    ``device`` one batch ahead, asynchronously, on a side CUDA stream.

    Batches may be tensors or tuples/lists/dicts of them; other values pass through. Tensors
    in pinned memory (``DataLoader(pin_memory=True)``) are copied directly; others are first
    copied into reused pinned staging buffers (each refilled only after its previous copy has
    finished, by CUDA event). The consumer's current stream waits for each batch's copy and the
    device tensors are recorded on it, so they are safe to use and to free at once. An iterable
    that recycles its own pinned buffers must not refill one until the batch after next is
    requested (``Loader`` on the CPU with ``buffers="recycle"`` meets this).

    ``device=None`` picks the current CUDA device when CUDA is available. On the CPU
    (``device="cpu"``, or no CUDA) batches pass through unchanged, so the same training loop
    runs everywhere.
    """

    def __init__(self, iterable: Iterable[Any], device: str | torch.device | None = None) -> None:
        self.iterable = iterable
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = resolve_device(device)
        self._transfer = CudaTransfer(self.device) if self.device is not None and self.device.type == "cuda" else None  # type: ignore[arg-type]
        self._staging: dict[tuple[tuple[int, ...], torch.dtype], collections.deque[list[Any]]] = {}

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if self._transfer is None:
            yield from self.iterable
            return
        transfer = self._transfer
        pending: collections.deque[tuple[Any, list[torch.Tensor], Any]] = collections.deque()
        source = iter(self.iterable)
        exhausted = False
        while True:
            while not exhausted and len(pending) < 2:  # the batch to hand out, and the next one in flight
                try:
                    batch = next(source)
                except StopIteration:
                    exhausted = True
                    break
                pending.append(self._issue(batch))
            if not pending:
                return
            structure, tensors, event = pending.popleft()
            transfer.hand_over(tensors, event)
            yield structure

    def _issue(self, batch: Any) -> tuple[Any, list[torch.Tensor], Any]:
        assert self._transfer is not None
        hosts: list[torch.Tensor] = []
        _map_tensors(batch, hosts.append)
        staged: list[list[Any]] = []
        sources = []
        for t in hosts:
            if t.device.type == "cpu" and not t.is_pinned():
                entry = self._stage(t)
                staged.append(entry)
                sources.append(entry[0])
            else:
                sources.append(t)
        devices, event = self._transfer.issue(sources)
        for entry in staged:
            entry[1] = event
        it = iter(devices)
        structure = _map_tensors(batch, lambda _t: next(it))
        return structure, devices, event

    def _stage(self, t: torch.Tensor) -> list[Any]:
        """A pinned staging buffer holding a copy of ``t`` (a ring of 3 per shape and dtype)."""
        key = (tuple(t.shape), t.dtype)
        ring = self._staging.setdefault(key, collections.deque())
        if len(ring) < 3:
            entry = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True), None]
        else:
            entry = ring.popleft()
            if entry[1] is not None:
                entry[1].synchronize()  # its last copy to the device has finished
        ring.append(entry)
        entry[0].copy_(t)
        return entry


def _map_tensors(batch: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``batch`` with every tensor replaced by ``fn(tensor)``, walking tuples, lists and dicts in order."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_map_tensors(b, fn) for b in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_map_tensors(b, fn) for b in batch)
    if isinstance(batch, dict):
        return {k: _map_tensors(v, fn) for k, v in batch.items()}
    return batch
