"""The fault campaign: kill, interrupt, damage and starve conversions; count what is lost.

    python -m benchmarks.faults --trials 20 --update-results    # the table in docs/RELIABILITY.md
    python -m benchmarks.faults --trials 2 --formats blob       # a quick look (writes benchmarks/out/)

For each format, a generated image folder (``packer/samples.py``) is converted once without
interruption by ``packer convert`` (the reference), then each trial converts it again in a child
process (``-j 2``, a checkpoint every :data:`CHECKPOINT_SECONDS`) and injects one fault:

* ``sigkill``: SIGKILL of the conversion's process group (it and its workers) at a random point
  *during the run* (after DST.partial appears), *during finish* (inside ``Writer.finish``,
  whose fsyncs and renames the child slows by :data:`FINISH_STEP_SECONDS` each so the kill can
  land between them) or *during a resume* (a first run killed after a checkpoint, then its
  ``--resume`` run killed); then ``--resume``.
* ``sigint``: Ctrl-C (SIGINT to the process group) at a random point in the same three phases:
  it must exit 130 saying how many inputs are saved (then ``--resume``) or that nothing was
  (then a plain re-run), or finish normally.
* ``byteflip``: one random byte of one random sample's stored payload, in a copy of the
  reference, is changed; ``packer verify`` must exit 1 naming that sample.
* ``enospc``: the conversion writes into a tmpfs of a random size below the dataset's (needs
  root to mount it); it must exit 1 with one line, and leave nothing a reader accepts.

Every finished output is compared with the reference: every sample's label, shape and bytes,
and the metadata apart from ``created``; ``packer verify`` must pass. **Data lost** counts a
result that differs or a command that could not finish the conversion, a checkpoint that an
interruption or a resumed run lost (fewer saved inputs than before, or none where the message
says some are saved), a reader that accepts an unfinished output, and damage ``packer verify``
does not report. Output: a table, and ``benchmarks/out/faults.json`` (``--update-results``:
``benchmarks/results/faults.json``).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from packer.bench import SUFFIX
from packer.writers.base import partial_path
from packer.writers.journal import journal_path, saved_inputs

from .common import add_output_arguments, machine, markdown_table, output_dir, save_json, run_main

__all__ = [
    "FORMATS", "KINDS", "PHASES", "Campaign", "Trial", "Digest", "digest", "run_campaign", "summarise", "render", "main",
    "tmpfs_available",
]

FORMATS = ("lmdb", "hdf5", "blob", "webdataset")
KINDS = ("sigkill", "sigint", "byteflip", "enospc")
PHASES = ("run", "finish", "resume")
#: The child commits a checkpoint this often (seconds), so a short run has several.
CHECKPOINT_SECONDS = 0.05
#: Inside ``Writer.finish`` each fsync and rename waits this long first, so a kill lands between them.
FINISH_STEP_SECONDS = 0.01
SIZE = 24
SHARD_SIZE = 20
SOURCE_SIZE = (96, 128)  # height, width of the generated JPEGs
CLASSES = 4
#: Longest a child conversion may take before it counts as hung (seconds).
HANG_SECONDS = 120.0

#: The child: ``python -c CHILD CHECKPOINT_SECONDS MARKER STEP_SECONDS packer-args...``. With a
#: MARKER path, ``Writer.finish`` writes it on entry (and its duration on exit) and slows its
#: fsyncs and renames by STEP_SECONDS each.
CHILD = """
import os, sys, time
import packer.writers.journal as journal
journal.CHECKPOINT_SECONDS = float(sys.argv[1])
marker, step = sys.argv[2], float(sys.argv[3])
if marker:
    from packer.writers.base import Writer
    real_finish, real_fsync, real_replace = Writer.finish, os.fsync, os.replace
    def slowly(fn):
        def call(*args, **kwargs):
            time.sleep(step)
            return fn(*args, **kwargs)
        return call
    def finish(self, meta):
        started = time.monotonic()
        with open(marker, "w") as handle:
            handle.write("finishing\\n")
        os.fsync, os.replace = slowly(real_fsync), slowly(real_replace)
        try:
            return real_finish(self, meta)
        finally:
            os.fsync, os.replace = real_fsync, real_replace
            with open(marker, "a") as handle:
                handle.write(f"{time.monotonic() - started}\\n")
    Writer.finish = finish
from packer.cli import cli
cli(sys.argv[4:])
"""


# -- comparing datasets ---------------------------------------------------------------------
@dataclass(frozen=True)
class Digest:
    """What two conversions must agree on: the metadata (apart from ``created``) and every
    sample's label, shape and a SHA-256 of its bytes."""

    meta: dict[str, Any]
    samples: tuple[tuple[int, tuple[int, ...], str], ...]

    def difference(self, other: "Digest") -> str | None:
        """``None`` if equal, else the first difference in words."""
        if len(self.samples) != len(other.samples):
            return f"{len(other.samples)} samples instead of {len(self.samples)}"
        for i, (want, got) in enumerate(zip(self.samples, other.samples)):
            if want != got:
                return f"sample {i}: label/shape/bytes {got[:2]} {got[2][:12]} instead of {want[:2]} {want[2][:12]}"
        for key in sorted(set(self.meta) | set(other.meta)):
            if self.meta.get(key) != other.meta.get(key):
                return f"metadata {key!r}: {other.meta.get(key)!r} instead of {self.meta.get(key)!r}"
        return None


def digest(path: Path) -> Digest:
    """The :class:`Digest` of the packed dataset at ``path`` (raw encoding: the decoded array's
    bytes are the stored payload)."""
    from readers.formats import open_store

    store = open_store(path)  # its handles close when it is dropped, on return
    samples = []
    for i in range(len(store)):
        image, label = store.read(i)
        samples.append((int(label), tuple(image.shape), hashlib.sha256(image.tobytes()).hexdigest()))
    meta = store.meta.to_dict()
    meta.pop("created", None)
    return Digest(meta, tuple(samples))


def accepted_by_a_reader(path: Path) -> bool:
    """Whether a reader opens ``path`` as a packed dataset (an unfinished output must not open)."""
    from readers.formats import open_store

    try:
        open_store(path)
    except Exception:  # noqa: BLE001 - any refusal is what we want
        return False
    return True


# -- running conversions ----------------------------------------------------------------------
@dataclass
class Setup:
    """What every trial of one format shares."""

    fmt: str
    src: Path
    reference: Path
    expected: Digest
    bytes: int  # the reference's size on disk
    workers: int
    # A checkpointing run, timed for the trials' random points: from its start, from DST.partial
    # appearing and from its first checkpoint to its exit; and its Writer.finish, slowed as in the trials.
    total_seconds: float = 1.0
    run_seconds: float = 1.0
    checkpointed_seconds: float = 0.5
    finish_seconds: float = 0.1
    python: str = sys.executable

    def args(self, dst: Path, *extra: str) -> list[str]:
        shard = ["--shard-size", str(SHARD_SIZE)] if self.fmt == "webdataset" else []
        return ["convert", str(self.src), str(dst), "--format", self.fmt, "--size", str(SIZE), "-j", str(self.workers), "-q", *shard, *extra]


@dataclass
class Child:
    """One ``packer convert`` child process, in a process group of its own."""

    proc: subprocess.Popen
    started: float
    code: int | None = None
    stderr: str = ""

    def wait(self, timeout: float = HANG_SECONDS) -> int:
        try:
            _out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            _out, err = self.proc.communicate()
            err = f"hung for {timeout:.0f} s and was killed\n{err}"
        self.code, self.stderr = self.proc.returncode, err
        return self.code

    def signal(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def last_line(self) -> str:
        return self.tail(1)

    def tail(self, lines: int) -> str:
        """The last ``lines`` non-empty lines of its stderr, joined with `` | ``."""
        kept = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        return " | ".join(kept[-lines:])


def start(setup: Setup, args: list[str], *, marker: Path | None = None) -> Child:
    command = [setup.python, "-c", CHILD, str(CHECKPOINT_SECONDS), str(marker or ""), str(FINISH_STEP_SECONDS), *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return Child(proc, time.monotonic())


def wait_for(condition: Callable[[], bool], child: Child, timeout: float = HANG_SECONDS) -> bool:
    """Poll until ``condition()``; ``False`` if the child exits (or time runs out) first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if not child.running or time.monotonic() > deadline:
            return condition()
        time.sleep(0.001)
    return True


def disk_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- trials -----------------------------------------------------------------------------------
@dataclass
class Trial:
    """One fault injected and what came of it."""

    format: str
    kind: str
    number: int
    phase: str = ""
    outcome: str = ""
    data_lost: bool = False
    detail: str = ""
    seconds: float = 0.0
    extra_output: bool = False  # more on stderr than the one line of its message
    notes: list[str] = field(default_factory=list)

    def lose(self, why: str) -> None:
        self.data_lost = True
        self.detail = f"{self.detail}; {why}" if self.detail else why


def check_final(setup: Setup, trial: Trial, dst: Path, child: Child | None) -> None:
    """After the command that should have finished the conversion: it did, the result equals
    the reference and verifies, and nothing unfinished is left beside it."""
    from packer.verify import verify

    if child is not None and child.code != 0:
        trial.lose(f"the finishing command exited {child.code}: {child.last_line()}")
        return
    if not dst.exists():
        trial.lose("no output after the finishing command")
        return
    difference = setup.expected.difference(digest(dst))
    if difference:
        trial.lose(f"differs from the uninterrupted run: {difference}")
    report = verify(dst)
    if not report.ok:
        trial.lose(f"packer verify: {report.faults[0] if report.faults else report.summary()}")
    leftovers = sorted(p.name for p in dst.parent.iterdir() if p.name != dst.name)
    if leftovers:
        trial.notes.append(f"left beside DST: {', '.join(leftovers)}")


def after_kill(setup: Setup, trial: Trial, dst: Path, before: int | None = None) -> str:
    """Where a killed or interrupted run left things: ``complete``, ``checkpoint`` or ``nothing``
    (a lost checkpoint or an unfinished output a reader accepts is data lost)."""
    partial = partial_path(dst)
    saved = saved_inputs(partial)
    if partial.exists() and accepted_by_a_reader(partial):
        trial.lose(f"a reader accepts the unfinished {partial.name}")
    if before is not None and (saved or 0) < before and not dst.exists():
        trial.lose(f"the checkpoint of {before} inputs was lost ({saved or 0} saved now)")
    if dst.exists():
        difference = setup.expected.difference(digest(dst))
        if difference:
            trial.lose(f"DST exists after the kill but differs: {difference}")
        return "complete" + (" (journal left)" if saved is not None else "")
    return "checkpoint" if saved is not None else "nothing"


def kill_at(setup: Setup, child: Child, phase: str, rng: random.Random, dst: Path, marker: Path, signum: int) -> bool:
    """Send ``signum`` to the child's group at a random point of ``phase``; ``False`` if it ended first."""
    if phase == "finish":
        if not wait_for(marker.exists, child):
            return False
        time.sleep(rng.uniform(0.0, setup.finish_seconds))
    elif phase == "resume":  # DST.partial is there already: any point from the resumed run's start
        time.sleep(rng.uniform(0.0, setup.total_seconds))
    else:
        if not wait_for(partial_path(dst).exists, child):
            return False
        time.sleep(rng.uniform(0.0, setup.run_seconds))
    if not child.running:
        return False
    child.signal(signum)
    return True


def first_run_killed_after_a_checkpoint(setup: Setup, trial: Trial, dst: Path, rng: random.Random) -> int | None:
    """The start of a ``resume`` trial: a run SIGKILLed at a random point after its first
    checkpoint. The inputs saved, or ``None`` (it finished first: the trial is moot)."""
    child = start(setup, setup.args(dst))
    journal = journal_path(partial_path(dst)) / "journal.json"
    if not wait_for(journal.exists, child):
        child.wait()
        return None
    time.sleep(rng.uniform(0.0, 0.5 * setup.checkpointed_seconds))
    child.signal(signal.SIGKILL)
    child.wait()
    if dst.exists():
        return None
    return saved_inputs(partial_path(dst))


def trial_signal(setup: Setup, trial: Trial, work: Path, rng: random.Random, signum: int) -> None:
    """``sigkill``/``sigint`` in one phase, then the command that finishes the conversion."""
    dst = work / f"out{SUFFIX[setup.fmt]}"
    marker = work.parent / f"{work.name}.finishing"
    before = None
    if trial.phase == "resume":
        before = first_run_killed_after_a_checkpoint(setup, trial, dst, rng)
        if before is None:
            trial.outcome = "finished before the first kill"
            check_final(setup, trial, dst, None)
            return
    child = start(setup, setup.args(dst, *(["--resume"] if before is not None else [])), marker=marker if trial.phase == "finish" else None)
    hit = kill_at(setup, child, trial.phase, rng, dst, marker, signum)
    child.wait()
    state = after_kill(setup, trial, dst, before)
    if not hit or child.code == 0:
        trial.outcome = "finished before the signal"
        check_final(setup, trial, dst, child)
        return
    if signum == signal.SIGKILL:
        trial.outcome = KILLED.get(state, f"killed: {state}")
        told = "--resume"
    else:
        told = interrupted(trial, child, state, dst)
    if state.startswith("complete"):
        check_final(setup, trial, dst, None)  # everything is there; what does the command we were told to run say?
        if signum == signal.SIGINT:
            finishing = start(setup, setup.args(dst, *([told] if told else [])))
            if finishing.wait() != 0:
                trial.notes.append(f"then {told or 'a plain re-run'}, as told: exit {finishing.code}: {finishing.last_line()[:200]}")
        return
    check_final(setup, trial, dst, finish_as_told(setup, trial, dst, told))


#: What a SIGKILL left, by :func:`after_kill`'s state.
KILLED = {
    "complete": "complete before the kill",
    "complete (journal left)": "complete before the kill, its journal left",
    "checkpoint": "resumed from a checkpoint",
    "nothing": "killed before the first checkpoint: a fresh start",
}


def interrupted(trial: Trial, child: Child, state: str, dst: Path) -> str:
    """Classify a Ctrl-C'd run by its exit code and message; the option its message says to run
    again with (``--resume``, or ``""`` for a plain re-run)."""
    lines = [line.strip() for line in child.stderr.splitlines() if line.strip()]
    said = next((line for line in reversed(lines) if "interrupted" in line), "")
    if said and len(lines) > 1 or not said and lines:
        trial.extra_output = True
        trial.notes.append(f"{len(lines) - bool(said)} more lines on stderr: {child.tail(4)[:400]}")
    saved = saved_inputs(partial_path(dst))
    if child.code != 130:
        trial.outcome = f"unexpected exit {child.code}"
        told = "--resume"
    elif "inputs are saved" in said:
        claimed = int(said.split("interrupted: ", 1)[1].split(" of ", 1)[0].replace(",", ""))
        if saved != claimed and not dst.exists():
            trial.lose(f"said {claimed} inputs are saved, the journal holds {saved}")
        trial.outcome = "exit 130, N inputs saved: then --resume"
        told = "--resume"
    elif "before the first checkpoint" in said or "nothing was written" in said:
        if state == "checkpoint":
            trial.notes.append(f"said {said!r}, and an earlier run's checkpoint of {saved} inputs is kept")
        trial.outcome = "exit 130, nothing saved: then a plain re-run"
        told = ""
    else:
        trial.outcome = "exit 130, another message"
        trial.notes.append(child.tail(3)[:300])
        told = "--resume"
    if state.startswith("complete"):
        trial.outcome += " (DST was already complete)"
        trial.notes.append(f"interrupted after the rename, said: {said[:200]}")
    return told


def finish_as_told(setup: Setup, trial: Trial, dst: Path, told: str) -> Child:
    """Run the command the message said (``told``); if a plain re-run is refused with a hint to
    ``--resume``, follow the hint, as a user would."""
    finishing = start(setup, setup.args(dst, *([told] if told else [])))
    finishing.wait()
    if finishing.code != 0 and not told and "--resume" in finishing.last_line():
        trial.notes.append(f"the plain re-run said: {finishing.last_line()[:200]}; then --resume")
        finishing = start(setup, setup.args(dst, "--resume"))
        finishing.wait()
    return finishing


def locate_payload(files: list[Path], payload: bytes) -> tuple[Path, int] | None:
    """The one place (file, offset) where ``payload`` is stored, or ``None`` if not exactly one."""
    found = []
    for path in files:
        data = path.read_bytes()
        at = data.find(payload)
        while at >= 0:
            found.append((path, at))
            at = data.find(payload, at + 1)
    return found[0] if len(found) == 1 else None


def trial_byteflip(setup: Setup, trial: Trial, work: Path, rng: random.Random) -> None:
    """Change one random byte of one random sample's stored payload; ``packer verify`` must say which."""
    from readers.formats import open_store

    dst = work / setup.reference.name
    if setup.reference.is_dir():
        shutil.copytree(setup.reference, dst)
        files = sorted(p for p in dst.rglob("*") if p.is_file())
    else:
        shutil.copy2(setup.reference, dst)
        files = [dst]
    store = open_store(setup.reference)
    count = len(store)
    where = None
    for _ in range(8):  # a sample whose bytes occur exactly once in the files
        index = rng.randrange(count)
        payload = store.read(index)[0].tobytes()
        where = locate_payload(files, payload)
        if where is not None:
            break
    del store
    if where is None:
        trial.outcome = "no sample's payload located"
        return
    path, offset = where
    at = offset + rng.randrange(len(payload))
    with open(path, "r+b") as handle:
        handle.seek(at)
        old = handle.read(1)[0]
        handle.seek(at)
        handle.write(bytes([old ^ rng.randrange(1, 256)]))
    trial.detail = f"sample {index}: byte {at} of {path.relative_to(work)}"
    result = subprocess.run([setup.python, "-m", "packer", "verify", str(dst)], capture_output=True, text=True, timeout=HANG_SECONDS)
    faults = [line for line in result.stdout.splitlines() if line.startswith("fault:")]
    if result.returncode == 1 and any(f"sample {index}" in line.split(":", 2)[1] for line in faults):
        trial.outcome = "reported at the right sample"
    elif result.returncode == 1:
        trial.outcome = "reported, elsewhere"
        trial.notes.append(faults[0] if faults else result.stderr.strip()[:200])
    else:
        trial.outcome = "not reported"
        trial.lose(f"packer verify exited {result.returncode} after {trial.detail}")


def tmpfs_available(where: Path) -> str | None:
    """``None`` if a tmpfs can be mounted here, else why not."""
    probe = where / "tmpfs-probe"
    probe.mkdir(parents=True, exist_ok=True)
    try:
        mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True, text=True)
        if mount.returncode != 0:
            return f"cannot mount a tmpfs ({mount.stderr.strip() or mount.returncode}; needs root)"
        subprocess.run(["umount", str(probe)], check=True)
        return None
    except OSError as exc:
        return f"cannot mount a tmpfs ({exc})"
    finally:
        probe.rmdir()


def trial_enospc(setup: Setup, trial: Trial, work: Path, rng: random.Random) -> None:
    """Convert into a tmpfs smaller than the dataset: one line, exit 1, nothing a reader accepts."""
    disk = work / "disk"
    disk.mkdir()
    size = max(4096, -(-int(setup.bytes * rng.uniform(0.05, 0.8)) // 4096) * 4096)
    trial.detail = f"tmpfs of {size:,} bytes (the dataset: {setup.bytes:,})"
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], check=True, capture_output=True)
    try:
        dst = disk / f"out{SUFFIX[setup.fmt]}"
        child = start(setup, setup.args(dst))
        child.wait()
        lines = [line for line in child.stderr.splitlines() if line.strip()]
        left = sorted(disk.iterdir())
        readable = [p.name for p in left if accepted_by_a_reader(p)]
        if child.code == 0:
            trial.outcome = "the disk was large enough"
            check_final(setup, trial, dst, child)
            return
        if readable:
            trial.lose(f"a reader accepts {', '.join(readable)} after the failure")
        one_line = len(lines) == 1 and "no space left" in lines[0] and "Traceback" not in child.stderr
        trial.extra_output = len(lines) > 1
        if child.code == 1 and one_line:
            trial.outcome = "exit 1, one line"
        elif child.code < 0:
            trial.outcome = f"killed by signal {-child.code} ({signal.Signals(-child.code).name})"
        else:
            trial.outcome = f"exit {child.code}, " + ("no 'no space left' line" if len(lines) <= 1 else "more than one line")
        trial.outcome += ", nothing left" if not left else ", files left"
        if left:
            trial.notes.append(f"left on the full disk: {', '.join(p.name for p in left)}")
        if not one_line:
            trial.notes.append(f"{len(lines)} lines on stderr, ending: {child.tail(4)[:400]}")
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# -- the campaign -------------------------------------------------------------------------------
@dataclass
class Campaign:
    """What to run."""

    trials: int = 20
    formats: tuple[str, ...] = FORMATS
    kinds: tuple[str, ...] = KINDS
    seed: int = 0
    images: int = 160
    workers: int = 2
    workdir: Path | None = None


def prepare(fmt: str, src: Path, root: Path, workers: int) -> Setup:
    """The reference conversion (plain ``packer convert``), and a checkpointing run that must
    equal it and times the run and its (slowed) finish for the trials' random points."""
    setup = Setup(fmt, src, root / f"reference{SUFFIX[fmt]}", Digest({}, ()), 0, workers)
    done = subprocess.run([sys.executable, "-m", "packer", *setup.args(setup.reference)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the reference {fmt} conversion failed: {done.stderr.strip()}")
    setup.expected, setup.bytes = digest(setup.reference), disk_bytes(setup.reference)
    probe = root / f"calibrate-{fmt}"
    probe.mkdir()
    dst, marker = probe / f"out{SUFFIX[fmt]}", root / f"calibrate-{fmt}.finishing"
    child = start(setup, setup.args(dst), marker=marker)
    wait_for(partial_path(dst).exists, child)
    appeared = time.monotonic()
    wait_for((journal_path(partial_path(dst)) / "journal.json").exists, child)
    checkpointed = time.monotonic()
    if child.wait() != 0:
        raise RuntimeError(f"the checkpointing {fmt} conversion failed: {child.stderr.strip()}")
    ended = time.monotonic()
    setup.total_seconds, setup.run_seconds, setup.checkpointed_seconds = ended - child.started, ended - appeared, ended - checkpointed
    lines = marker.read_text().split()
    setup.finish_seconds = float(lines[-1]) if len(lines) > 1 else 0.1
    difference = setup.expected.difference(digest(dst))
    if difference:
        raise RuntimeError(f"{fmt}: a run with frequent checkpoints differs from the reference: {difference}")
    shutil.rmtree(probe)
    return setup


RUNNERS: dict[str, Callable[[Setup, Trial, Path, random.Random], None]] = {
    "sigkill": lambda s, t, w, r: trial_signal(s, t, w, r, signal.SIGKILL),
    "sigint": lambda s, t, w, r: trial_signal(s, t, w, r, signal.SIGINT),
    "byteflip": trial_byteflip,
    "enospc": trial_enospc,
}


def run_trials(setup: Setup, kind: str, count: int, root: Path, seed: int) -> Iterator[Trial]:
    """``count`` trials of ``kind`` on ``setup``'s format, each in a folder of its own."""
    for number in range(count):
        rng = random.Random(f"{seed}-{setup.fmt}-{kind}-{number}")
        trial = Trial(setup.fmt, kind, number, phase=PHASES[number % len(PHASES)] if kind in ("sigkill", "sigint") else "")
        work = root / f"{setup.fmt}-{kind}-{number}"
        work.mkdir()
        started = time.monotonic()
        try:
            RUNNERS[kind](setup, trial, work, rng)
        except Exception as exc:  # noqa: BLE001 - a trial that breaks is reported, and counts as a loss
            trial.outcome = trial.outcome or "the trial itself failed"
            trial.lose(f"{type(exc).__name__}: {exc}")
        trial.seconds = time.monotonic() - started
        shutil.rmtree(work, ignore_errors=True)
        yield trial


def run_campaign(campaign: Campaign, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every trial; the JSON-ready results (settings, machine, every trial, the summary)."""
    from packer.samples import make_image_folder

    root = Path(tempfile.mkdtemp(prefix="packer-faults-", dir=campaign.workdir))
    started = time.monotonic()
    trials: list[Trial] = []
    skipped: dict[str, str] = {}
    timings: dict[str, dict[str, float]] = {}
    try:
        src = make_image_folder(root / "src", classes=CLASSES, per_class=max(1, campaign.images // CLASSES), size=SOURCE_SIZE, seed=campaign.seed)
        if "enospc" in campaign.kinds:
            why = tmpfs_available(root)
            if why:
                skipped["enospc"] = why
                say(f"enospc: skipped: {why}")
        for fmt in campaign.formats:
            setup = prepare(fmt, src, root, campaign.workers)
            timings[fmt] = {"bytes": setup.bytes, "total_seconds": setup.total_seconds, "run_seconds": setup.run_seconds,
                            "checkpointed_seconds": setup.checkpointed_seconds, "finish_seconds": setup.finish_seconds}
            say(f"{fmt}: reference {setup.bytes:,} bytes; a run {setup.total_seconds:.2f} s ({setup.run_seconds:.2f} s writing, "
                f"{setup.checkpointed_seconds:.2f} s after its first checkpoint, finish {setup.finish_seconds:.3f} s)")
            for kind in campaign.kinds:
                if kind in skipped:
                    continue
                for trial in run_trials(setup, kind, campaign.trials, root, campaign.seed):
                    trials.append(trial)
                    lost = f"  DATA LOST: {trial.detail}" if trial.data_lost else ""
                    say(f"  {fmt} {kind} #{trial.number} {trial.phase}: {trial.outcome} ({trial.seconds:.1f} s){lost}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "date": datetime.date.today().isoformat(),
        "settings": {**asdict(campaign), "workdir": str(campaign.workdir or tempfile.gettempdir()), "size": SIZE,
                     "source_size": SOURCE_SIZE, "shard_size": SHARD_SIZE, "checkpoint_seconds": CHECKPOINT_SECONDS,
                     "finish_step_seconds": FINISH_STEP_SECONDS},
        "skipped": skipped,
        "calibration": timings,
        "seconds": time.monotonic() - started,
        "summary": summarise(trials, campaign.formats),
        "trials": [asdict(t) for t in trials],
    }


TITLES = {
    "sigkill": "SIGKILL of `packer convert` and its workers at a random point, then `--resume`",
    "sigint": "SIGINT (Ctrl-C) at a random point, then `--resume` (or a plain re-run if nothing was saved)",
    "byteflip": "one random byte of a random sample's stored payload changed, then `packer verify`",
    "enospc": "ENOSPC: a tmpfs smaller than the dataset",
}


def summarise(trials: list[Trial], formats: tuple[str, ...]) -> list[dict[str, Any]]:
    """Rows of the table: per kind, trials per format and data lost; then per phase and per outcome."""
    rows = []
    for kind in KINDS:
        mine = [t for t in trials if t.kind == kind]
        if not mine:
            continue

        def row(title: str, chosen: list[Trial], level: int) -> dict[str, Any]:
            per = Counter(t.format for t in chosen)
            return {"kind": kind, "level": level, "fault": title, "trials": {f: per.get(f, 0) for f in formats},
                    "data_lost": sum(t.data_lost for t in chosen)}

        rows.append(row(TITLES[kind], mine, 0))
        for phase in PHASES:
            chosen = [t for t in mine if t.phase == phase]
            if chosen:
                rows.append(row(f"during {'a resume' if phase == 'resume' else 'the ' + phase}", chosen, 1))
        for outcome in sorted({t.outcome for t in mine}):
            rows.append(row(outcome, [t for t in mine if t.outcome == outcome], 1))
        noisy = [t for t in mine if t.extra_output]
        if noisy:
            rows.append(row("more on stderr than the one line of the message", noisy, 1))
    return rows


def render(results: dict[str, Any]) -> str:
    formats = results["settings"]["formats"]
    rows = []
    for row in results["summary"]:
        title = row["fault"] if row["level"] == 0 else f"... {row['fault']}"
        lost = f"**{row['data_lost']}**" if row["level"] == 0 else str(row["data_lost"])
        rows.append([title, *(row["trials"][f] for f in formats), lost])
    lines = [markdown_table(["fault injected", *formats, "data lost"], rows)]
    total = sum(r["data_lost"] for r in results["summary"] if r["level"] == 0)
    trials = sum(sum(r["trials"].values()) for r in results["summary"] if r["level"] == 0)
    lines.append(f"\n{trials} trials, data lost: {total}")
    for kind, why in results["skipped"].items():
        lines.append(f"{kind}: not run: {why}")
    for trial in results["trials"]:
        name = f"{trial['format']} {trial['kind']} #{trial['number']} {trial['phase']}".rstrip()
        if trial["data_lost"]:
            lines.append(f"data lost: {name}: {trial['detail']}")
        for note in trial["notes"]:
            lines.append(f"note: {name}: {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20, help="trials per format and kind of fault (default 20)")
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--seed", type=int, default=0, help="the random points and bytes (and the generated images)")
    parser.add_argument("--images", type=int, default=160, help="generated images to convert (default 160)")
    parser.add_argument("--workers", type=int, default=2, help="-j of the conversions (default 2)")
    parser.add_argument("--workdir", type=Path, help="where the throwaway conversions go (default: the system's temporary folder)")
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    if args.trials < 1 or args.images < CLASSES:
        parser.error(f"--trials must be at least 1 and --images at least {CLASSES}")
    campaign = Campaign(args.trials, tuple(args.formats), tuple(args.kinds), args.seed, args.images, args.workers, args.workdir)
    results = run_campaign(campaign)
    results["command"] = "python -m benchmarks.faults " + " ".join(sys.argv[1:] if argv is None else argv)
    results["machine"] = machine()
    print()
    print(render(results))
    print("saved", save_json("faults", results, output_dir(args.update_results, args.out)))
    return 1 if any(t["data_lost"] for t in results["trials"]) else 0


if __name__ == "__main__":
    run_main(main)
