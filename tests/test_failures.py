"""Every failure to write DST is one line and exit code 1, through the real command line.

``python -m packer convert`` runs in a subprocess (so a traceback, a C library's message or a
crash would show on the real stderr), for every format, into: ``/proc``, ``/sys``, a folder the
user cannot write (immutable, for root), a read-only file system and a full disk (small tmpfs
mounts, where this process may mount), and below a file. Each must
print exactly one ``Error: DST: ...`` line saying what to do, exit 1, and leave nothing behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from packer.samples import make_image_folder

REPO = Path(__file__).resolve().parents[1]
FORMATS = ("lmdb", "hdf5", "blob", "webdataset")
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob", "webdataset": ".shards"}


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """A folder holding SRC: 2 classes x 6 JPEGs of 96x128."""
    root = tmp_path_factory.mktemp("failures")
    make_image_folder(root / "src", classes=2, per_class=6, size=(96, 128))
    return root


def convert(src: Path, dst: Path, fmt: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "packer", "convert", str(src), str(dst), "-f", fmt, "--size", "48", "-q", "-j", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )


def assert_one_line(result: subprocess.CompletedProcess, dst: Path, says: str) -> None:
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1, result.stderr  # no traceback, no decoder or HDF5 chatter
    assert lines[0].startswith(f"Error: {dst}: ") and says in lines[0], lines[0]
    assert "Errno" not in lines[0] and result.stdout == ""


@contextmanager
def tmpfs(where: Path, options: str) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)
        where.rmdir()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("folder, kind", [("/proc", "proc"), ("/sys", "sysfs")])
def test_a_kernel_file_system(places, fmt, folder, kind):
    if not Path(folder).is_dir():
        pytest.skip(f"no {folder} here")
    dst = Path(folder) / f"packer-test{SUFFIX[fmt]}"
    result = convert(places / "src", dst, fmt)
    assert_one_line(result, dst, f"{folder} is a kernel file system ({kind}), not a disk; choose a DST on a disk")
    assert not os.path.lexists(dst) and not os.path.lexists(f"{dst}.partial") and not os.path.lexists(f"{dst}.partial-lock")


@contextmanager
def unwritable_folder(folder: Path) -> Iterator[Path]:
    """A folder this user cannot create files in: read-only bits, or for root (whom permission
    bits do not stop, and who cannot run this venv's Python as another user: it lives under
    /root) the immutable attribute."""
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a folder immutable here (chattr +i)")
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_folder_the_user_cannot_write(places, fmt, tmp_path):
    with unwritable_folder(tmp_path / "locked") as folder:
        dst = folder / f"x{SUFFIX[fmt]}"
        result = convert(places / "src", dst, fmt)
        assert_one_line(result, dst, f"folder {folder} is not writable; check its permissions, or choose another DST")
        assert os.listdir(folder) == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_where_a_folder_is_expected(places, fmt, tmp_path):
    (tmp_path / "some_file").write_bytes(b"12345")
    dst = tmp_path / "some_file" / f"x{SUFFIX[fmt]}"
    result = convert(places / "src", dst, fmt)
    assert_one_line(result, dst, f"{tmp_path / 'some_file'} is not a folder (a file of 5 bytes); choose a DST inside a folder")
    assert sorted(os.listdir(tmp_path)) == ["some_file"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_read_only_file_system(places, fmt, tmp_path):
    with tmpfs(tmp_path / "ro", "ro,size=1m") as folder:
        dst = folder / f"x{SUFFIX[fmt]}"
        result = convert(places / "src", dst, fmt)
        assert_one_line(result, dst, f"folder {folder} is on a read-only file system; choose a DST on a writable disk")


@pytest.mark.parametrize("size", ["8k", "48k"])  # full almost at once; part-way (12 samples of 48x48 raw: ~83 KB)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_full_disk(places, fmt, size, tmp_path):
    """Every format: one line (HDF5 checks the space before libhdf5 writes, which crashed the
    process on a full disk; closing a file that cannot flush during cleanup is not an error)."""
    with tmpfs(tmp_path / "full", f"size={size}") as folder:
        dst = folder / f"x{SUFFIX[fmt]}"
        result = convert(places / "src", dst, fmt)
        assert_one_line(result, dst, "no space left on the device; free some space or choose another DST")
        assert os.listdir(folder) == []
