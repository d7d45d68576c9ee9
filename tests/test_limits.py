"""Resource limits a command can run into (a fault sweep): too few open files, a file-size limit
under /dev/shm's blocks, a memory limit. One line each, never a traceback from a process of ours."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest
from click.testing import CliRunner

from packer import engine
from packer.cli import cli


def _limited(limit: int, value: int, *args: str) -> subprocess.CompletedProcess:
    def apply() -> None:
        resource.setrlimit(limit, (value, resource.getrlimit(limit)[1]))

    return subprocess.run([sys.executable, "-m", "packer", *args], capture_output=True, text=True, timeout=120, preexec_fn=apply)


def test_too_few_open_files_is_one_line_or_fewer_workers(tmp_path, image_folder):
    """It failed as a worker started: the fork server printed an EOFError traceback above the
    CLI's own 60-line one. At each limit: converted (with fewer workers, said) or one line."""
    error = "Error: Too many open files: the open-file limit (ulimit -n) is too low for this; raise it\n"
    outcomes = set()
    for files in range(12, 30, 3):
        dst = tmp_path / f"o{files}.blob"
        done = _limited(resource.RLIMIT_NOFILE, files, "convert", str(image_folder), str(dst), "--size", "8", "-j", "2", "-q")
        assert (done.returncode, done.stderr) in ((0, ""), (1, error)), (files, done.stderr)
        assert dst.exists() is (done.returncode == 0) and not (tmp_path / f"o{files}.blob.partial").exists()
        outcomes.add(done.returncode)
    assert outcomes == {0, 1}
    done = _limited(resource.RLIMIT_NOFILE, 256, "convert", str(image_folder), str(tmp_path / "o.blob"), "--size", "8", "-j", "2")
    assert done.returncode == 0 and "with 2 workers" in done.stdout, done.stderr


def test_workers_are_capped_to_the_open_file_limit(tmp_path, image_folder, monkeypatch):
    monkeypatch.setattr(engine, "_spare_descriptors", lambda: engine._DESCRIPTORS_PER_WORKER + 1)
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(tmp_path / "o.blob"), "--size", "8", "-j", "2"])
    assert result.exit_code == 0, result.output
    assert "warning: --workers 2: the open-file limit (ulimit -n) leaves room for 1; using 1" in result.stderr
    assert "with 1 worker" in result.stdout


@pytest.mark.parametrize("suffix", [".blob", ".h5"])
def test_a_file_size_limit_under_the_shared_memory_blocks_is_one_line(tmp_path, image_folder, suffix):
    """The 16 MiB result blocks failed under it inside SharedMemory, and Python's resource
    tracker printed a KeyError traceback for each; the workers now answer through their pipes."""
    done = _limited(resource.RLIMIT_FSIZE, 1 << 20, "convert", str(image_folder), str(tmp_path / f"o{suffix}"), "--size", "8", "-j", "2")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "KeyError" not in done.stderr, done.stderr
    assert "come through its pipe (slower)" in done.stderr and "file-size limit" in done.stderr


def test_running_out_of_memory_anywhere_is_one_line(tmp_path, image_folder, monkeypatch):
    from packer import api

    def out_of_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(api, "convert", out_of_memory)
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(tmp_path / "o.blob"), "--size", "8"])
    assert result.exit_code == 1 and result.stderr == (
        "Error: out of memory: raise the memory limit (ulimit -v), free some memory, or pass fewer --workers\n"), result.output
