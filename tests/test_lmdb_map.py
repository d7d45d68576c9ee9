"""How the LMDB writer maps its file, read back from the kernel (``/proc/self/smaps``), not
from py-lmdb's own flags: written through a shared writable map where the blocks can be
reserved, and advised random, so a write fault on a new page reads (zeroes) no pages around it
(``packer/writers/lmdb.py``)."""

import sys
from pathlib import Path

import pytest

from packer.preprocess.task import Encoded
from packer.writers.lmdb import LMDBWriter
from readers.formats.lmdb import DATA_FILE

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


def map_flags(path: Path) -> list[set[str]]:
    """The ``VmFlags`` of every mapping of ``path`` in this process."""
    target, found, current = str(path.resolve()), [], None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and "-" in fields[0] and fields[5] == target:
            current = True
        elif len(fields) >= 1 and "-" in fields[0] and ":" not in fields[0]:
            current = None
        elif line.startswith("VmFlags:") and current:
            found.append(set(fields[1:]))
    return found


def test_the_writers_map_is_shared_writable_and_advised_random(tmp_path):
    writer = LMDBWriter(tmp_path / "out.lmdb")
    try:
        writer.add(Encoded(1, (3, 8, 8), bytes(192)))
        writer._flush()  # the sample is in the map now
        flags = map_flags(writer.tmp / DATA_FILE)
        assert flags, "the data file is not mapped"
        assert all("rr" in f for f in flags), flags  # MADV_RANDOM: no read-around on a fault
        if writer._preallocate:
            assert any({"sh", "wr"} <= f for f in flags), flags  # writemap: written through the map
    finally:
        writer.abort()
