"""``packer bench`` end to end on a tiny folder: every format measured, sizes of the real
conversions, the fastest recommended, no temporary files left."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer import ImageOptions, convert
from packer.bench import Rate, measure
from packer.cli import cli
from packer.samples import make_image_folder
from readers.schema import FORMATS

RAW_FOLDER_READERS = {"DataLoader(num_workers=0)", "DataLoader(num_workers=1)"}
PACKED_READERS = RAW_FOLDER_READERS | {"readers.Loader"}
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "webdataset": ".shards", "blob": ".blob"}
UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}


@dataclass(frozen=True)
class Row:
    """One row of the bench table, parsed."""

    pipeline: str
    reader: str
    median: float | None  # None: not measured (the cell holds the reason)
    on_disk: float | None
    convert_rate: float | None
    text: str


def parse_table(output: str) -> list[Row]:
    lines = [line for line in output.splitlines() if line.startswith("|")]
    assert lines[0] == "| pipeline | reader | images/s median (min-max) | vs raw folder | on disk | convert img/s |"
    rows = []
    for line in lines[2:]:
        pipeline, reader, rate, _ratio, disk, rate_in = [cell.strip() for cell in line.strip("|").split("|")]
        m = re.fullmatch(r"([\d,]+) \(([\d,]+)-([\d,]+)\)", rate)
        d = re.fullmatch(r"([\d.]+) (B|KB|MB|GB)", disk)
        rows.append(Row(
            pipeline, reader, float(m[1].replace(",", "")) if m else None, float(d[1]) * UNITS[d[2]] if d else None,
            float(rate_in.replace(",", "")) if rate_in else None, line,
        ))
    return rows


def allocated_bytes(path: Path) -> int:
    """Bytes the file or folder's blocks take on disk (``du``)."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_blocks * 512 for p in files)


def test_bench_measures_every_format_and_recommends_the_fastest(tmp_path: Path) -> None:
    """Every format has a measured row per reader (a format that cannot be converted or read
    fails here, it does not drop out), its size on disk is that of the format's real conversion
    of the sample, and the recommendation names the fastest measured row."""
    src = make_image_folder(tmp_path / "images", classes=2, per_class=12, size=(60, 80))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = CliRunner().invoke(
        cli,
        ["bench", str(src), "--sample", "24", "--size", "32", "--workers", "1", "--seconds", "0.05", "--repeats", "1",
         "--tmp-dir", str(scratch), "--quiet"],
    )
    assert result.exit_code == 0, result.output
    out = result.output
    rows = parse_table(out)
    assert not [row.text for row in rows if row.median is None], "rows not measured"
    assert {row.reader for row in rows if row.pipeline == "raw folder"} == RAW_FOLDER_READERS
    packed = [row for row in rows if row.pipeline != "raw folder"]
    (tmp_path / "ref").mkdir()
    assert sorted({row.pipeline for row in packed}) == sorted(f"{fmt} (raw)" for fmt in FORMATS)
    for fmt in FORMATS:
        mine = allocated_bytes(convert(src, tmp_path / "ref" / f"d{SUFFIX[fmt]}", format=fmt, image=ImageOptions(size=32), workers=1).dst)
        rows_of = [row for row in packed if row.pipeline == f"{fmt} (raw)"]
        assert {row.reader for row in rows_of} == PACKED_READERS, fmt
        for row in rows_of:  # the same 24 images in the same format: the same size, to 3 printed digits and a page
            assert abs(row.on_disk - mine) <= 0.01 * mine + 4096, (row.text, mine)
            assert row.convert_rate > 0, row.text
    fastest = max(row.median for row in packed)
    named = re.search(r"Recommendation: (.+?) read with (.+?): ([\d,]+) images/s", out)
    assert named, out
    pick = next(row for row in packed if (row.pipeline, row.reader) == named.group(1, 2))
    assert pick.median == fastest == float(named[3].replace(",", ""))
    fmt = pick.pipeline.split(" ")[0]
    assert f"packer convert {src} DST{SUFFIX[fmt]}{' --format webdataset' if fmt == 'webdataset' else ''} --size 32" in out  # a suffix that says the format says it alone
    assert list(scratch.iterdir()) == []  # the sample links and every conversion are gone


def test_bench_cleans_up_on_interrupt(tmp_path: Path, monkeypatch) -> None:
    import packer.bench as bench

    src = make_image_folder(tmp_path / "images", classes=2, per_class=3, size=(40, 40))
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "loader_rates", interrupted)
    result = CliRunner().invoke(cli, ["bench", str(src), "--size", "16", "--tmp-dir", str(scratch), "--quiet"])
    assert result.exit_code == 130
    assert "interrupted" in result.output
    assert list(scratch.iterdir()) == []


def test_measure_times_the_repeats_not_the_warmup() -> None:
    """Passes of 100 items taking at least 10, 20 and 40 ms after a warm-up of 10**9 items in no
    time: the rates are items per second of the timed passes only (bounds, never exact times)."""
    passes = iter([(10**9, 0.0), (100, 0.01), (100, 0.04), (100, 0.02)])
    calls = []

    def one_pass() -> int:
        items, seconds = next(passes)
        calls.append(items)
        time.sleep(seconds)
        return items

    rate = measure(one_pass, repeats=3, warmup=1)
    assert isinstance(rate, Rate) and rate.runs == 3 and len(calls) == 4
    assert 100 < rate.max <= 100 / 0.01  # the warm-up's 10**9 items are not in it; items/s, not s/item
    assert rate.median <= 100 / 0.02 and rate.min <= 100 / 0.04


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_bench_cleans_up_on_signals_even_in_the_background(tmp_path: Path, signame: str) -> None:
    """SIGTERM and SIGHUP stop ``packer bench`` as Ctrl-C does, and so does SIGINT for a bench the
    shell started ignoring it (a background job): the temporary folder is removed, exit 130."""
    import os
    import signal
    import subprocess
    import sys

    src = make_image_folder(tmp_path / "images", classes=2, per_class=20, size=(200, 200))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "packer", "bench", str(src), "--size", "64", "--tmp-dir", str(scratch), "--seconds", "30", "-j", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as a shell starts a background job
    )
    deadline = time.time() + 60
    def first_conversion_written() -> bool:
        # The bench renames ``data.lmdb.partial`` while we walk the folder: a vanished entry is a retry.
        try:
            return any(scratch.rglob("*.lmdb"))
        except FileNotFoundError:
            return False

    while not first_conversion_written():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.02)
    proc.send_signal(getattr(signal, signame))
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted; temporary files removed" in err and "Traceback" not in err
    assert os.listdir(scratch) == []


_SHARER_BROKEN_OFF = """
import os, socket, sys, time
from multiprocessing import connection, resource_sharer
if sys.argv[1] == "quiet":
    from packer.bench_timing import quiet_handle_sharing
    quiet_handle_sharing(0)
resource_sharer.DupFd(os.open(os.devnull, os.O_RDONLY))  # starts the serving thread, as a batch's handle does
with socket.socket(socket.AF_UNIX) as client:  # a main process interrupted mid-handshake
    client.connect(resource_sharer._resource_sharer._address)
    client.recv(1)
time.sleep(2)  # (the serving thread prints, or not, meanwhile)
try:  # any other error still reaches the hook before it
    raise ConnectionResetError("not the handle sharing")
except ConnectionResetError:
    sys.excepthook(*sys.exc_info())
print("done")
"""


@pytest.mark.parametrize("quiet", [False, True])
def test_a_loader_worker_says_nothing_when_the_main_process_drops_a_handle_mid_way(quiet: bool) -> None:
    """``packer bench``'s DataLoader workers serve each batch's shared-memory handle from
    multiprocessing's resource_sharer thread; interrupted mid-handshake, the main process
    drops the connection, and that thread printed a traceback under the one-line message
    (seen once in 40 SIGTERMed benches). With the bench's ``worker_init_fn`` it is dropped."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _SHARER_BROKEN_OFF, "quiet" if quiet else "plain"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr
    assert run.stderr.count("Traceback") == (1 if quiet else 2) and "not the handle sharing" in run.stderr, run.stderr


def test_the_bench_loaders_workers_are_quiet_about_a_dropped_handle(monkeypatch) -> None:
    import packer.bench_timing as timing

    made = []
    monkeypatch.setattr(timing, "DataLoader", lambda *args, **kwargs: made.append(kwargs) or [])
    monkeypatch.setattr(timing, "measure", lambda *args, **kwargs: None)
    timing.loader_rates([], settings=[0, 2], batch_size=4, seconds=0.1, repeats=1, with_loader=False)
    assert [kwargs["worker_init_fn"] for kwargs in made] == [timing.quiet_handle_sharing] * 2


@pytest.mark.parametrize("command", ["bench", "doctor"])
def test_an_archive_is_refused_saying_what_they_read(image_folder, tmp_path, command):
    """An archive got the folder scanner's 'SRC must be ... an archive (.tar ...)', which says
    archives are fine (an ImageNet user's walkthrough): one line saying they read a folder."""
    import tarfile

    archive = tmp_path / "train.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(image_folder, arcname="train")
    result = CliRunner().invoke(cli, [command, str(archive), "--size", "16"])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert "packer bench and packer doctor read a folder of images" in result.stderr
    missing = CliRunner().invoke(cli, [command, str(tmp_path / "typo"), "--size", "16"])  # not an archive: said as it is (a review)
    assert missing.exit_code == 1 and "no such" in missing.stderr and "archive into a folder" not in missing.stderr, missing.output
