"""benchmarks.core_scaling runs CI-sized on any machine: every worker count from 1 to --workers,
the work alone and each format's conversion, and each share is the conversion's rate over the
work's in the same round (issue 16, item 4)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is a package of the repository, not installed
from benchmarks import core_scaling  # noqa: E402
from benchmarks.work_units import Dropped, WrittenAlone  # noqa: E402

from packer import ImageOptions  # noqa: E402
from packer.preprocess.task import ImageTask  # noqa: E402
from packer.sources.images import scan_image_folder  # noqa: E402


def test_worker_counts_double_up_to_the_largest():
    assert core_scaling.worker_counts(1) == [1]
    assert core_scaling.worker_counts(2) == [1, 2]
    assert core_scaling.worker_counts(16) == [1, 2, 4, 8, 16]
    assert core_scaling.worker_counts(6) == [1, 2, 4, 6]


def test_the_dropped_work_is_the_conversions_work(image_folder):
    item = scan_image_folder(image_folder).items[0]
    task = ImageTask(ImageOptions(size=24))
    assert Dropped(task)(item) == len(task(item).payload) == 3 * 24 * 24


def test_the_work_and_write_puts_each_sample_at_its_place(image_folder, tmp_path):
    """(c) writes the sample the conversion's work makes, byte for byte, at index x its size (read
    back with plain ``open``), and survives pickling to a worker (its open file is not sent)."""
    import pickle

    items = scan_image_folder(image_folder).items[:3]
    task = ImageTask(ImageOptions(size=24))
    out = tmp_path / "floor.bin"
    out.write_bytes(bytes(3 * 3 * 24 * 24))
    unit = WrittenAlone(task, str(out), 3 * 24 * 24)
    assert unit((2, items[2])) == 3 * 24 * 24
    moved = pickle.loads(pickle.dumps(unit))  # the fd opened above stays here
    assert moved((0, items[0])) == 3 * 24 * 24
    unit.close(), moved.close()
    data = out.read_bytes()
    assert data[: 3 * 24 * 24] == task(items[0]).payload
    assert data[3 * 24 * 24 : 2 * 3 * 24 * 24] == bytes(3 * 24 * 24)
    assert data[2 * 3 * 24 * 24 :] == task(items[2]).payload


def test_a_ci_sized_run_reports_every_worker_count_and_format(tmp_path, capsys):
    core_scaling.main(["--images", "20", "--rounds", "1", "--workers", "2", "--formats", "lmdb", "blob", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "core_scaling.json").read_text())
    assert result["worker_counts"] == [1, 2] and result["images"] == 20
    assert set(result["rates"]) == {"work alone", "lmdb", "blob"}
    for fmt in ("lmdb", "blob"):
        for w in ("1", "2"):
            [alone], [rate] = result["rates"]["work alone"][w]["runs"], result["rates"][fmt][w]["runs"]
            assert alone > 0 and rate > 0
            assert result["shares"][fmt][w]["runs"] == [rate / alone]
    assert result["command"] and result["machine"]["cores"] >= 1 and "write_floor_shares" not in result
    printed = capsys.readouterr().out
    assert "| workers | work alone | lmdb | blob |" in printed
    if core_scaling.cpu_ticks() is not None:  # Linux: the CPU account per image
        account = result["cpu_ms_per_image"]
        assert set(account) == {"work alone", "lmdb", "blob"} and all(set(account[n]) == {"1", "2"} for n in account)
        assert all(set(parts) == {"user", "system", "idle"} and min(parts.values()) >= 0 for n in account for parts in account[n].values())
        assert account["work alone"]["1"]["user"] > 0.1  # decoding and resizing a JPEG takes a core more than 0.1 ms
        assert "user / system / idle" in printed


def test_the_write_floor_is_a_row_of_its_own_not_a_format(tmp_path, capsys):
    """--write-floor adds (c) to the rates and the table, with its shares apart from the formats'
    (the targets table reads every key of "shares" as a format)."""
    core_scaling.main(["--images", "20", "--rounds", "1", "--counts", "2", "--formats", "blob", "--write-floor", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "core_scaling.json").read_text())
    assert set(result["rates"]) == {"work alone", core_scaling.FLOOR, "blob"} and set(result["shares"]) == {"blob"}
    [alone], [written] = result["rates"]["work alone"]["2"]["runs"], result["rates"][core_scaling.FLOOR]["2"]["runs"]
    assert result["write_floor_shares"]["2"]["runs"] == [written / alone]
    assert "| workers | work alone | work and write | blob |" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == [tmp_path / "core_scaling.json"]


def test_the_cpu_account_counts_what_the_machine_did():
    """Over a spin of 0.2 s of CPU, the machine's user and system time cover this process's own (as
    getrusage counts it), and all three parts together fit in the machine's cores over the time."""
    if core_scaling.cpu_ticks() is None:
        import pytest

        pytest.skip("no /proc/stat")
    import os
    import resource
    import time

    def own_ms() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return (usage.ru_utime + usage.ru_stime) * 1000

    start, mine, before = time.perf_counter(), own_ms(), core_scaling.cpu_ticks()
    while own_ms() < mine + 200:  # (0.2 s of this process's CPU time: on a busy machine, longer on the clock)
        pass
    account = core_scaling.cpu_per_image(before, 1)
    wall_ms, mine = (time.perf_counter() - start) * 1000, own_ms() - mine
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    assert mine > 100 and account["user"] + account["system"] >= mine - 2 * tick
    assert sum(account.values()) <= wall_ms * os.cpu_count() + 2 * tick * os.cpu_count()


def test_a_benchmark_stopped_by_sigterm_removes_its_temporary_folder(tmp_path):
    """A benchmark killed by ``timeout`` or a scheduler (SIGTERM) unwinds as Ctrl-C does: its
    temporary folder of converted data is removed, one line, exit 130 (``common.run_main``).
    Before, SIGTERM ended core_scaling at once and left GBs under /tmp."""
    import tempfile

    # (a short path: the forkserver's socket in it, pymp-*/listener-*, has 107 bytes at most,
    # which pytest-xdist's deeper tmp_path left too few)
    scratch = Path(tempfile.mkdtemp(prefix="cs-"))
    try:
        _stopped_by_sigterm(scratch, tmp_path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _stopped_by_sigterm(scratch: Path, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import time

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.core_scaling", "--images", "20", "--rounds", "1000", "--workers", "1", "--formats", "blob",
         "--out", str(tmp_path / "out")],
        cwd=repo, env={**os.environ, "TMPDIR": str(scratch)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    while not any(scratch.glob("packer-core-scaling-*/out.blob")):  # conversions under way
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "interrupted; temporary files removed" and "Traceback" not in err
    assert os.listdir(scratch) == []
