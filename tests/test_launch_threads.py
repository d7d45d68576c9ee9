"""The ``packer`` command keeps numpy's OpenBLAS to one thread in its processes (packer/launch.py),
unless the user chose a count."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

COMMAND = textwrap.dedent("""
    import os, sys
    sys.argv = ["packer", "--version"]
    from packer.launch import main
    try:
        main()
    except SystemExit:
        pass
    print(os.environ.get("OPENBLAS_NUM_THREADS"))
""")

THREADS_AFTER_NUMPY = "import os, numpy; print(len(os.listdir('/proc/self/task')))"


def _run(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1]


def test_the_command_sets_one_blas_thread_for_itself_and_its_children() -> None:
    assert _run(COMMAND) == "1"


def test_a_count_the_user_chose_is_kept() -> None:
    assert _run(COMMAND, OPENBLAS_NUM_THREADS="3") == "3"


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2,
                    reason="counts threads in /proc; OpenBLAS starts none beside the main one on one core")
def test_one_blas_thread_means_numpy_starts_no_thread_of_its_own() -> None:
    """What the setting is for (numpy's own library, not packer): threads that spin at import."""
    assert _run(THREADS_AFTER_NUMPY, OPENBLAS_NUM_THREADS="1") == "1"
    assert int(_run(THREADS_AFTER_NUMPY)) > 1
