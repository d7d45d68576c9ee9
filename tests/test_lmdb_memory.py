"""How the LMDB writer's process uses memory, each case in a fresh process (what the test process
allocated before would hide it): it reuses the heap memory each transaction frees
(``files.keep_freed_heap``), and no stale memory of the process reaches the file (LMDB's
``meminit``)."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest


def run_fresh(script: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    return subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, check=True,
                          timeout=60).stdout


FAULTS_SCRIPT = """
import resource, sys
from packer.preprocess.task import Encoded
from packer.writers.lmdb import LMDBWriter
writer = LMDBWriter(sys.argv[1])
payload = bytes(150_528)  # a 224x224x3 sample
def add(count):
    for _ in range(count):
        writer.add(Encoded(1, (3, 224, 224), payload))
add(60)  # a few transactions in: the heap has grown to what one needs
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
add(120)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 120)
writer.abort()
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's heap thresholds")
def test_the_writer_reuses_the_memory_each_transaction_frees(tmp_path):
    """LMDB mallocs and frees every transaction's pages: without ``keep_freed_heap`` glibc gave
    them back and each came again as fresh pages, ~47 faults a 150 KB sample."""
    faults = float(run_fresh(FAULTS_SCRIPT, str(tmp_path / "out.lmdb")))
    assert faults < 10, faults  # ~2 with it: the map's B-tree pages and Python's own


STALE_SCRIPT = """
import ctypes, sys
from packer.preprocess.task import Encoded
from packer.writers.lmdb import LMDBWriter
from readers.formats.lmdb import DATA_FILE
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, (ctypes.c_size_t,), (ctypes.c_void_p,)
marker = b"STALE-MEMORY" * 1000
blocks = [libc.malloc(len(marker)) for _ in range(200)]
for block in blocks:  # the heap full of a pattern, then free: what the writer's pages are made of next
    ctypes.memmove(block, marker, len(marker))
for block in blocks:
    libc.free(block)
writer = LMDBWriter(sys.argv[1])
for _ in range(300):
    writer.add(Encoded(1, (1, 50, 101), bytes(5050)))  # values that leave most pages part-filled
writer._flush()
print((writer.tmp / DATA_FILE).read_bytes().count(b"STALE-MEMORY"))
writer.abort()
"""


def test_no_stale_memory_of_the_writer_reaches_the_file(tmp_path):
    """The unused bytes of LMDB's pages are zeros: with ``meminit=False`` they held whatever the
    process's memory held before, pickled work units and the pool's auth key among them
    (a plain-library read of a real output found them)."""
    assert run_fresh(STALE_SCRIPT, str(tmp_path / "out.lmdb")).strip() == "0"
