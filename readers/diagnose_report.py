"""What :func:`readers.diagnose` (:mod:`readers.diagnose_loop`) found: the figures, the verdict and the advice, in words.

Only measured figures go into the text: the verdict comes from the time the loop spent waiting
for data, each piece of advice from an alternative timed in the same rounds (or from a cost
measured on this machine), never from a table of rules of thumb.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Measured", "Alternative", "Diagnosis", "verdict", "advise", "DATA_BOUND", "PARTLY_DATA_BOUND"]

#: Fraction of the loop's time spent waiting for the next batch at and above which it is data-bound.
DATA_BOUND = 0.5
#: ... and at and above which it is partly data-bound (below: compute-bound).
PARTLY_DATA_BOUND = 0.15
#: A step this many times slower inside the loop than alone is competing with the loader.
CONTENDED = 1.25
#: An alternative must be this much faster than the loader to be advised.
_FASTER = 1.1


@dataclass(frozen=True)
class Measured:
    """One measurement over the rounds: images/s median (min-max of the rounds), batches/s and
    MB/s medians, and the CPU cores busy on average (this process and its children)."""

    images_per_s: float
    min: float
    max: float
    batches_per_s: float
    mb_per_s: float
    cpu_cores: float | None  # None: measured for too short a time to count CPU ticks

    def __str__(self) -> str:
        return f"{self.images_per_s:,.0f} img/s ({self.min:,.0f}-{self.max:,.0f})"

    @property
    def busy(self) -> str:
        return "CPU not measured (too short)" if self.cpu_cores is None else f"{self.cpu_cores:.1f} cores busy"


@dataclass(frozen=True)
class Alternative:
    """Another loader over the same data, timed alone in the same rounds; ``how``: the change."""

    label: str
    how: str
    measured: Measured


@dataclass
class Diagnosis:
    """The three measurements, the data-bound fraction and what to change. ``str()``: the report."""

    loader_name: str
    device: str
    batch_size: int
    sample_shape: list[int]
    sample_dtype: str
    rounds: int
    batches_per_round: int
    loader: Measured  # (a) the loader alone
    step: Measured  # (b) the step alone, on a batch already on the device: the headspace
    together: Measured  # (c) the training loop
    data_bound: float  # fraction of (c)'s time spent waiting for the next batch
    copy_share: float  # fraction of (c)'s time spent copying batches to the device
    step_slowdown: float  # a step's time inside (c) over its time alone in (b)
    cpu_cores: float | None  # CPU cores busy on average over all measurements (process + children)
    cores: int  # cores this process may use
    peak_rss_mb: float
    children_peak_rss_mb: float
    alternatives: list[Alternative] = field(default_factory=list)
    host_normalise_ms: float | None = None  # measured cost of making one float batch from uint8 on the CPU
    trace: str | None = None
    verdict: str = ""
    advice: list[str] = field(default_factory=list)

    @property
    def bound(self) -> str:
        """``"data-bound"``, ``"partly data-bound"`` or ``"compute-bound"``."""
        if self.data_bound >= DATA_BOUND:
            return "data-bound"
        return "partly data-bound" if self.data_bound >= PARTLY_DATA_BOUND else "compute-bound"

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON-safe), with ``bound`` added."""
        return {**dataclasses.asdict(self), "bound": self.bound}

    def __str__(self) -> str:
        shape = "x".join(map(str, self.sample_shape))
        lines = [
            f"diagnosis of {self.loader_name}: batches of {self.batch_size} x {shape} {self.sample_dtype}, step on {self.device}",
            f"  measured in {self.rounds} interleaved rounds of {self.batches_per_round} batches each; median (min-max) of the rounds",
            f"  (a) loader alone    {self.loader}  {self.loader.mb_per_s:,.0f} MB/s  {self.loader.busy}",
            f"  (b) step alone      {self.step}  (one batch already on the device: the headspace)",
            f"  (c) training loop   {self.together}  {self.together.busy}",
            f"  waiting for data: {self.data_bound:.0%} of the loop; copying to the device: {self.copy_share:.0%}; "
            f"a step takes x{self.step_slowdown:.2f} its time alone",
            f"  CPU: {'-' if self.cpu_cores is None else format(self.cpu_cores, '.1f')} of {self.cores} cores busy on average "
            "(this process and its workers); "
            f"peak RSS {self.peak_rss_mb:,.0f} MB (+ {self.children_peak_rss_mb:,.0f} MB in live workers)",
        ]
        for alt in self.alternatives:
            lines.append(f"  alternative: {alt.label:<24} {alt.measured}  {alt.measured.busy}")
        if self.trace:
            lines.append(f"  profiler trace: {self.trace} (TensorBoard: tensorboard --logdir DIR; or ui.perfetto.dev)")
        lines.append(f"verdict: {self.verdict}")
        lines += [f"advice: {line}" for line in self.advice]
        return "\n".join(lines)


def verdict(d: Diagnosis) -> str:
    """One sentence: what bounds the loop, with the figures that show it."""
    figures = f"the loader alone gives {d.loader.images_per_s:,.0f} img/s, the step could take {d.step.images_per_s:,.0f}"
    if d.bound == "data-bound":
        return f"data-bound: {d.data_bound:.0%} of each step waits for data; {figures}"
    if d.bound == "partly data-bound":
        return f"partly data-bound: {d.data_bound:.0%} of each step waits for data; {figures}"
    share = d.together.images_per_s / d.step.images_per_s if d.step.images_per_s > 0 else 0.0
    if d.step_slowdown >= CONTENDED:
        return (
            f"compute-bound but contended: only {d.data_bound:.0%} of each step waits for data, yet a step takes "
            f"x{d.step_slowdown:.1f} its time alone: the loader competes with it for the CPU (the loop runs at {share:.0%} "
            f"of the step alone, {d.together.images_per_s:,.0f} of {d.step.images_per_s:,.0f} img/s)"
        )
    return (
        f"compute-bound: only {d.data_bound:.0%} of each step waits for data; the loop runs at {share:.0%} of the step alone "
        f"({d.together.images_per_s:,.0f} of {d.step.images_per_s:,.0f} img/s); faster data would not help"
    )


#: Rounds of one measurement this far apart (max over min), or a loop over 10% faster than its
#: step alone, are noise, not a finding: said first. (A busy machine spreads the rounds and the
#: verdict can still hold: the step alone of ``benchmarks/results/doctor_folder.json``; a run of
#: a few batches spreads them far more.)
UNSTEADY = 3.0


def unsteady(d: Diagnosis) -> str | None:
    """Why these figures are too noisy to act on (measured for too short a time, or on a busy
    machine), or ``None``: the widest spread of rounds, or a loop faster than its step alone."""
    measured = [("the loader alone", d.loader), ("the step alone", d.step), ("the loop", d.together)]
    measured += [(f"alternative {a.label}", a.measured) for a in d.alternatives]
    spreads = [(m.max / m.min, what) for what, m in measured if m.min > 0]
    widest = max(spreads, default=(1.0, ""))
    if widest[0] >= UNSTEADY:
        why = f"the rounds of {widest[1]} differ x{widest[0]:.1f}"
    elif d.step.images_per_s > 0 and d.together.images_per_s > 1.1 * d.step.images_per_s:
        why = f"the loop ran at {d.together.images_per_s / d.step.images_per_s:.0%} of its step alone, which it cannot do"
    else:
        return None
    return (f"these figures are noise, not a finding: {why}; measure for longer (more --batches or --rounds; "
            "diagnose(batches=..., rounds=...)) on a machine doing nothing else, before changing anything")


def advise(d: Diagnosis) -> list[str]:
    """The changes worth making, each with the gain measured here; first, when the figures are
    too noisy to act on (:func:`unsteady`), that."""
    caution = unsteady(d)
    advice: list[str] = [caution] if caution else []
    if d.bound != "compute-bound" or d.step_slowdown >= CONTENDED:
        faster = sorted(
            (a for a in d.alternatives if a.measured.images_per_s > _FASTER * d.loader.images_per_s),
            key=lambda a: -a.measured.images_per_s,
        )
        for alt in faster:
            expected = min(alt.measured.images_per_s, d.step.images_per_s)
            gain = expected / d.together.images_per_s if d.together.images_per_s > 0 else float("inf")
            advice.append(
                f"{alt.label}: {alt.measured.images_per_s:,.0f} img/s alone (measured here, x{alt.measured.images_per_s / d.loader.images_per_s:.1f} "
                f"the loader), so the loop could reach ~{expected:,.0f} img/s (x{gain:.1f}): {alt.how}"
            )
        if not faster and d.alternatives:
            advice.append("none of the alternatives measured here reads faster than this loader: " + ", ".join(
                f"{a.label} {a.measured.images_per_s:,.0f} img/s" for a in d.alternatives))
        if d.cpu_cores is not None and d.cpu_cores >= 0.85 * d.cores:
            advice.append(f"the CPU is saturated ({d.cpu_cores:.1f} of {d.cores} cores busy): more workers or threads cannot help, "
                          "less work per image can (decode once, ahead of training: packer convert)")
    if d.copy_share >= PARTLY_DATA_BOUND and d.device.startswith("cuda"):  # (on the CPU there is no copy to hide: noise)
        advice.append(
            f"copying to the device takes {d.copy_share:.0%} of the loop: pin the host batches and copy them ahead on a side stream "
            "(readers.Loader(device='cuda'), or readers.CUDAPrefetcher around any loader)"
        )
    if d.host_normalise_ms is not None and d.bound != "compute-bound":
        per_batch = 1000 / d.loader.batches_per_s if d.loader.batches_per_s > 0 else 0.0
        advice.append(
            f"batches arrive as {d.sample_dtype}: making one from uint8 costs {d.host_normalise_ms:.1f} ms of CPU here "
            f"(the loader delivers a batch every {per_batch:.1f} ms), and the copy carries 4x the bytes; send uint8 and "
            "normalise on the device (readers.Normalize)"
        )
    if advice == ([caution] if caution else []):
        advice.append("nothing to change on the data side" if d.bound == "compute-bound" else
                      "no alternative loader was measured (diagnose(..., alternatives=...); packer doctor on an image folder times a packed copy)")
    return advice
