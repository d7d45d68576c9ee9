"""Kill a conversion right after its first resume checkpoint (for the --resume tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: A child running ``packer ARGS`` with a checkpoint every 20 ms.
CHILD = "import sys, packer.writers.journal as j; j.CHECKPOINT_SECONDS = 0.02; from packer.cli import cli; cli(sys.argv[1:])"


def convert_until_checkpoint(args: list[str], journal: Path, timeout: float = 60.0) -> int:
    """Run ``packer *args`` in a child process, SIGKILL it (and its workers) soon after ``journal``
    appears, and return how many inputs that checkpoint committed."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + timeout
    while not journal.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.005)
    time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()  # reaps it and closes the pipes
    return json.loads(journal.read_text())["inputs"]
