"""``readers.diagnose(loader, step)``: is the training loop waiting for data, and what would help?

(This module is ``diagnose_loop``, not ``diagnose``, so that ``readers.diagnose`` stays the function
once the module is imported.)

Three measurements, taken in interleaved rounds so that machine noise hits all of them alike:

(a) the loader alone: batches, images and MB per second;
(b) the step alone, on one batch already on the device (the headspace: how fast training could
    go if data were free);
(c) both together, as the training loop runs them: the time spent waiting for the next batch
    (the data-bound fraction), copying it to the device, and in the step.

Alternatives (other loaders over the same data: more threads or workers, a packed copy) are
timed alone in the same rounds, so advice comes from figures measured here, never from a table.
It works with any iterable of ``(images, labels)`` batches: a torch ``DataLoader``, a packer
:class:`~readers.loader.Loader`, another library's loader. The report text is in
:mod:`readers.diagnose_report`. ``readers`` never imports ``packer``: ``packer doctor`` adds the
"convert it" alternative.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from .diagnose_report import Alternative, Diagnosis, Measured, advise, verdict

__all__ = ["diagnose", "Diagnosis", "Alternative", "Measured", "DiagnoseError", "StepError", "LoaderError"]

Step = Callable[[Any, Any], Any]

#: CPU time is counted in clock ticks (10 ms): a shorter measurement gives no CPU figure.
_CPU_MIN_SECONDS = 0.5


class DiagnoseError(ValueError):
    """What the user gave cannot be diagnosed (one line, naming it)."""


class StepError(DiagnoseError):
    """The user's step raised."""


class LoaderError(DiagnoseError):
    """The loader raised, yielded nothing, or yielded something that is not an ``(images, labels)`` batch."""


@dataclass
class _Phase:
    """One measurement's totals over a round."""

    seconds: float = 0.0
    batches: int = 0
    images: int = 0
    bytes: int = 0
    cpu: float = 0.0
    wait: float = 0.0
    copy: float = 0.0
    stepping: float = 0.0

    def rate(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Rounds:
    phases: dict[str, list[_Phase]] = field(default_factory=dict)

    def add(self, name: str, phase: _Phase) -> None:
        self.phases.setdefault(name, []).append(phase)

    def measured(self, name: str) -> Measured:
        phases = self.phases[name]
        rates = [p.rate() for p in phases]
        seconds = sum(p.seconds for p in phases)
        return Measured(
            images_per_s=statistics.median(rates), min=min(rates), max=max(rates),
            batches_per_s=statistics.median(p.batches / p.seconds for p in phases if p.seconds > 0),
            mb_per_s=statistics.median(p.bytes / p.seconds / 1e6 for p in phases if p.seconds > 0),
            cpu_cores=sum(p.cpu for p in phases) / seconds if seconds >= _CPU_MIN_SECONDS else None,
        )


class _Cycle:
    """Batches from ``loader`` forever (a new epoch when one ends), checked to be ``(images, labels)``.

    ``backlog``: how many batches the loader prepares ahead (DataLoader: ``prefetch_factor`` per
    worker; packer's Loader: ``prefetch``). While another measurement runs, the loader fills that
    many; :meth:`drain` takes them, untimed, so that each measurement sees the steady rate."""

    def __init__(self, loader: Iterable[Any], name: str) -> None:
        from .loader import Loader

        self.loader, self.name = loader, name
        self._it: Iterator[Any] | None = None
        # a packer Loader moves on an epoch at each pass: left as it was found, at close()
        self._unchanged = loader.unchanged() if isinstance(loader, Loader) else contextlib.nullcontext()
        self._unchanged.__enter__()
        workers = getattr(loader, "num_workers", 0) or 0
        if workers > 0:
            self.backlog = workers * (getattr(loader, "prefetch_factor", None) or 2)
        else:
            self.backlog = int(getattr(loader, "prefetch", 0) or 0)

    def drain(self) -> None:
        for _ in range(self.backlog):
            self.next()

    def next(self) -> tuple[Any, Any]:
        for fresh in (False, True):
            if self._it is None:
                self._it = iter(self.loader)
            try:
                batch = next(self._it)
            except StopIteration:
                self._it = None
                if fresh:
                    raise LoaderError(f"{self.name} yielded no batches") from None
                continue
            except Exception as exc:  # noqa: BLE001 - reported in one line
                raise LoaderError(f"{self.name} raised {type(exc).__name__}: {_first_line(exc)}") from exc
            return _check_batch(batch, self.name)
        raise AssertionError("unreachable")

    def close(self) -> None:
        close = getattr(self._it, "close", None) or getattr(self._it, "_shutdown_workers", None)
        self._it = None
        if close is not None:
            close()
        self._unchanged.__exit__(None, None, None)
        self._unchanged = contextlib.nullcontext()  # (once)


def _first_line(exc: BaseException) -> str:
    """The message's first line; for an error re-raised from a DataLoader worker ("Caught OSError
    in DataLoader worker process 1." and the worker's traceback), the worker's own message."""
    text = str(exc).strip().splitlines()
    if len(text) > 2 and text[0].startswith("Caught ") and "Original Traceback" in text[1]:
        original = text[-1].partition(": ")[2].strip()  # "OSError: path: what went wrong"
        if original:
            return original
    return text[0] if text else "(no message)"


def _check_batch(batch: Any, name: str) -> tuple[Any, Any]:
    if not isinstance(batch, (tuple, list)) or len(batch) != 2 or not isinstance(batch[0], torch.Tensor) or batch[0].dim() < 1:
        what = type(batch).__name__ + (f" of {len(batch)}" if isinstance(batch, (tuple, list)) else "")
        raise LoaderError(f"{name} yielded a {what}, not an (images, labels) batch whose images are a tensor (N, ...)")
    return batch[0], batch[1]


def _nbytes(images: torch.Tensor) -> int:
    return images.numel() * images.element_size()


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor) and value.device != device:
        return value.to(device, non_blocking=True)
    return value


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- CPU and memory of this process and its children ----------------------------------------
def _children(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children") if os.path.isdir("/proc") else ():
            with contextlib.suppress(OSError, ValueError):
                kids = [int(k) for k in task.read_text().split()]
                found += kids
                todo += kids
    return found


def _proc_cpu(pid: int) -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process, its finished children and its live ones."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    live = sum(_proc_cpu(pid) for pid in _children(os.getpid()))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + live


def _rss_mb(pid: int, key: str) -> float:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb() -> tuple[float, float]:
    """(peak resident MB of this process, sum of the peaks of its live children)."""
    mine = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return mine, sum(_rss_mb(pid, "VmHWM") for pid in _children(os.getpid()))


# -- the measurements ------------------------------------------------------------------------
def _call_step(step: Step, images: Any, labels: Any) -> None:
    try:
        step(images, labels)
    except Exception as exc:  # noqa: BLE001 - reported in one line
        name = getattr(step, "__qualname__", type(step).__name__)
        raise StepError(f"the step {name} raised {type(exc).__name__}: {_first_line(exc)}") from exc


def _time_loader(cycle: _Cycle, batches: int) -> _Phase:
    cycle.drain()
    phase, cpu0, start = _Phase(), cpu_seconds(), time.perf_counter()
    for _ in range(batches):
        images, _labels = cycle.next()
        phase.batches, phase.images, phase.bytes = phase.batches + 1, phase.images + len(images), phase.bytes + _nbytes(images)
    phase.seconds, phase.cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    return phase


def _time_step(step: Step, cached: tuple[Any, Any], batches: int, device: torch.device) -> _Phase:
    phase, cpu0 = _Phase(), cpu_seconds()
    _sync(device)
    start = time.perf_counter()
    for _ in range(batches):
        _call_step(step, *cached)
        phase.batches, phase.images = phase.batches + 1, phase.images + len(cached[0])
    _sync(device)
    phase.seconds, phase.cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    return phase


def _time_together(cycle: _Cycle, step: Step, batches: int, device: torch.device, ranges: bool = False) -> _Phase:
    """The user's loop; on CUDA the copy and the step are synchronised, so the time waiting for
    the next batch is time the device would sit idle."""
    cycle.drain()
    phase, cpu0 = _Phase(), cpu_seconds()
    label = torch.profiler.record_function if ranges else (lambda name: contextlib.nullcontext())
    _sync(device)
    start = time.perf_counter()
    for _ in range(batches):
        t0 = time.perf_counter()
        with label("diagnose.wait_for_batch"):
            images, labels = cycle.next()
        t1 = time.perf_counter()
        with label("diagnose.copy_to_device"):
            images, labels = _to(images, device), _to(labels, device)
            _sync(device)
        t2 = time.perf_counter()
        with label("diagnose.step"):
            _call_step(step, images, labels)
            _sync(device)
        t3 = time.perf_counter()
        phase.wait, phase.copy, phase.stepping = phase.wait + t1 - t0, phase.copy + t2 - t1, phase.stepping + t3 - t2
        phase.batches, phase.images, phase.bytes = phase.batches + 1, phase.images + len(images), phase.bytes + _nbytes(images)
    phase.seconds, phase.cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    return phase


def _trace(cycle: _Cycle, step: Step, batches: int, device: torch.device, trace: str | os.PathLike[str]) -> str:
    """One short profiled pass of the loop; a trace file for TensorBoard or Perfetto, its path."""
    from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

    folder = Path(trace)
    folder.mkdir(parents=True, exist_ok=True)
    before = set(folder.glob("*.pt.trace.json"))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    options: dict[str, Any] = {"activities": activities, "on_trace_ready": tensorboard_trace_handler(str(folder))}
    try:  # the loader's filling threads and DataLoader's pin thread too (torch >= 2.6; else the main thread only)
        options["experimental_config"] = torch.profiler._ExperimentalConfig(profile_all_threads=True)
    except (AttributeError, TypeError):  # pragma: no cover - older torch
        pass
    with profile(**options):
        _time_together(cycle, step, batches, device, ranges=True)
    written = sorted(set(folder.glob("*.pt.trace.json")) - before)
    return str(written[-1]) if written else str(folder)


def _slowdown(together: list[_Phase], alone: list[_Phase]) -> float:
    """How many times longer a step takes inside the loop than alone (> 1: something competes with it)."""
    in_loop = sum(p.stepping for p in together) / max(1, sum(p.batches for p in together))
    by_itself = sum(p.seconds for p in alone) / max(1, sum(p.batches for p in alone))
    return in_loop / by_itself if by_itself > 0 else 1.0


def _host_normalise_ms(images: torch.Tensor) -> float:
    """Median ms to make a float batch of this shape from uint8 pixels on the CPU (convert, scale, shift)."""
    pixels = torch.randint(0, 256, tuple(images.shape), dtype=torch.uint8)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        (pixels.float().div_(255) - 0.45).div_(0.225)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def diagnose(
    loader: Iterable[Any],
    step: Step,
    *,
    batches: int = 30,
    rounds: int = 3,
    warmup: int = 2,
    device: str | torch.device | None = None,
    trace: str | os.PathLike[str] | None = None,
    alternatives: dict[str, tuple[Iterable[Any], str]] | None = None,
    name: str | None = None,
) -> Diagnosis:
    """Time ``loader`` alone, ``step`` alone and both together, interleaved; say what bounds the loop.

    ``loader``: any iterable of ``(images, labels)`` batches (re-iterated when an epoch ends; a
    packer ``Loader``, whose passes move its epoch on, is left as it was: ``Loader.unchanged``);
    ``step(images, labels)``: one training step (its result is ignored). ``batches``: batches per
    measurement in all (split over ``rounds`` rounds, after ``warmup`` untimed batches; before each
    timed run of the loader, the batches it prepared ahead while idle are taken untimed).
    ``device``: where the step runs (default: CUDA when available, else the CPU); batches are
    copied there as the training loop would. ``trace``: a folder where one extra, short profiled
    pass writes a ``torch.profiler`` trace (TensorBoard / Perfetto) with the loop's stages (and
    the packer Loader's own ranges). ``alternatives``: ``{label: (loader, how)}``, other loaders
    over the same data timed alone in the same rounds; when the loop is data-bound, the advice
    names each that is faster, its measured rate and ``how`` (the change to make).

    Raises :class:`StepError` when the step raises, :class:`LoaderError` when the loader raises
    or yields something that is not a batch, :class:`DiagnoseError` for bad arguments (a
    ``trace`` folder that cannot be created among them, before anything is measured).
    """
    if batches < rounds or rounds < 1 or warmup < 0:
        raise DiagnoseError(f"batches={batches}, rounds={rounds}, warmup={warmup}: need rounds >= 1, batches >= rounds, warmup >= 0")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DiagnoseError(f"device={str(device)!r}: CUDA is not available here; use device='cpu'")
    if trace is not None:  # made before measuring: a folder that cannot be made said, not a raw OSError after the rounds
        try:
            Path(trace).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DiagnoseError(f"trace={os.fspath(trace)!r}: cannot create that folder ({exc.strerror or exc})") from None
    name = name or type(loader).__name__
    cycle = _Cycle(loader, name)
    others = {label: (_Cycle(alt, label), how) for label, (alt, how) in (alternatives or {}).items()}
    per_round = batches // rounds
    results = _Rounds()
    try:
        images, labels = cycle.next()
        cached = (_to(images, dev).clone(), _to(labels, dev))
        _call_step(step, *cached)  # warm-up, and the crash check before anything is timed
        for _ in range(warmup):
            _call_step(step, *cached)
            cycle.next()
        for alt, _how in others.values():
            for _ in range(max(1, warmup)):
                alt.next()
        wall0, cpu0 = time.perf_counter(), cpu_seconds()
        for _ in range(rounds):
            results.add("loader", _time_loader(cycle, per_round))
            results.add("step", _time_step(step, cached, per_round, dev))
            results.add("together", _time_together(cycle, step, per_round, dev))
            for label, (alt, _how) in others.items():
                results.add(label, _time_loader(alt, per_round))
        wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
        rss, children_rss = peak_rss_mb()
        trace_file = _trace(cycle, step, max(per_round, 4), dev, trace) if trace is not None else None
    finally:
        cycle.close()
        for alt, _how in others.values():
            alt.close()
    together = results.phases["together"]
    total = sum(p.seconds for p in together)
    found = Diagnosis(
        loader_name=name,
        device=str(dev),
        batch_size=len(cached[0]),
        sample_shape=list(cached[0].shape[1:]),
        sample_dtype=str(cached[0].dtype).replace("torch.", ""),
        rounds=rounds,
        batches_per_round=per_round,
        loader=results.measured("loader"),
        step=results.measured("step"),
        together=results.measured("together"),
        data_bound=sum(p.wait for p in together) / total if total > 0 else 0.0,
        copy_share=sum(p.copy for p in together) / total if total > 0 else 0.0,
        step_slowdown=_slowdown(together, results.phases["step"]),
        cpu_cores=cpu / wall if wall >= _CPU_MIN_SECONDS else None,
        cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
        peak_rss_mb=rss,
        children_peak_rss_mb=children_rss,
        alternatives=[Alternative(label, how, results.measured(label)) for label, (_c, how) in others.items()],
        trace=trace_file,
        host_normalise_ms=_host_normalise_ms(cached[0]) if cached[0].is_floating_point() else None,
    )
    found.verdict = verdict(found)
    found.advice = advise(found)
    return found
