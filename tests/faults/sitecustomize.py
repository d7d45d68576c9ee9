"""Fault injection for worker processes (tests/test_diskfull.py).

A spawned worker starts a fresh interpreter, so a test's monkeypatch does not reach it; with
this folder on PYTHONPATH and PACKER_TEST_SHARD_ERRNO set, Python imports this module at start-up
and the worker's shard writes fail with that errno from the third member on. Without the variable
it does nothing.
"""

from __future__ import annotations

import os

_CODE = os.environ.get("PACKER_TEST_SHARD_ERRNO")

if _CODE:
    from packer.writers.webdataset.tar import ShardFile

    _original = ShardFile._member
    _calls = {"n": 0}

    def _failing(self, *args, **kwargs):
        _calls["n"] += 1
        if _calls["n"] >= 3:
            raise OSError(int(_CODE), os.strerror(int(_CODE)))
        return _original(self, *args, **kwargs)

    ShardFile._member = _failing

_PLACE_CODE = os.environ.get("PACKER_TEST_PLACE_ERRNO")

if _PLACE_CODE:  # tests/test_placement.py: a worker's write of a sample into the output fails
    import packer.placement

    _place_calls = {"n": 0}
    _original_pwrite = packer.placement.pwrite_all

    def _failing_pwrite(fd, data, offset):
        _place_calls["n"] += 1
        if _place_calls["n"] >= 3:
            raise OSError(int(_PLACE_CODE), os.strerror(int(_PLACE_CODE)))
        return _original_pwrite(fd, data, offset)

    packer.placement.pwrite_all = _failing_pwrite
