"""A Ctrl-C of a WebDataset conversion to a slow store (moto's S3 on 127.0.0.1, its uploads held
back in the child): it stops at once, keeping its last checkpoint, instead of waiting for the
uploads in progress (an HF walkthrough waited 449 s for a slow store)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from packer import ImageOptions, StorageOptions, convert
from packer.remote import staging_folder
from checkpoints import CHILD
from test_remote import assert_same_output

#: Run first in the child: once its first checkpoint is committed, every shard upload waits an hour.
STALL = '''
import asyncio, os, s3fs
_real_put = s3fs.S3FileSystem._put_file
async def _put_file(self, lpath, rpath, *args, **kwargs):
    if str(rpath).endswith(".tar") and os.path.exists(os.environ["STALL_AFTER"]):
        await asyncio.sleep(3600)
    return await _real_put(self, lpath, rpath, *args, **kwargs)
s3fs.S3FileSystem._put_file = _put_file
'''


def test_a_ctrl_c_does_not_wait_for_uploads_in_progress(s3, tmp_path):
    from packer.samples import make_image_folder

    src = make_image_folder(tmp_path / "src", classes=2, per_class=30, size=(12, 16))
    url = "s3://packer-test/stalled"
    shutil.rmtree(staging_folder(url), ignore_errors=True)  # (machine-wide: an earlier run's journal)
    journal = staging_folder(url) / "stalled.partial-journal" / "journal.json"
    (tmp_path / "stall.py").write_text(STALL)
    args = ["convert", str(src), url, "-j", "1", "-q", "--size", "8", "-f", "webdataset", "--shard-size", "2"]
    child = f"exec(open({str(tmp_path / 'stall.py')!r}).read()); {CHILD}"
    proc = subprocess.Popen([sys.executable, "-c", child, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, env={**os.environ, "STALL_AFTER": str(journal)})
    try:
        deadline = time.time() + 60
        while not journal.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "no checkpoint appeared"
            time.sleep(0.01)
        time.sleep(0.5)  # (uploads are held back now: a flush or a join would wait an hour)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("a Ctrl-C waited for the uploads in progress")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert b"inputs are saved; run the same command with --resume to finish" in err, err
    saved = json.loads(journal.read_text())["inputs"]
    assert 0 < saved < 60

    kwargs = dict(format="webdataset", image=ImageOptions(size=8), storage=StorageOptions(shard_size=2), workers=1)
    convert(src, url, resume=True, **kwargs)
    reference = convert(src, tmp_path / "ref.shards", **kwargs)
    assert_same_output(s3, "packer-test/stalled", reference.dst)
