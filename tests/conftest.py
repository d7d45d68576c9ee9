"""Shared fixtures: small generated image folders and conversions of them (nothing is shipped)."""

from __future__ import annotations

import shutil
from datetime import datetime
import signal
from pathlib import Path

import pytest

from packer import ImageOptions, convert
from packer.samples import make_image_folder
from loopback import LOOPBACK, free_port, restart_worker_server

# A shell starts a background job (`pytest ... &` in a script) with SIGINT ignored, and Python
# then never raises KeyboardInterrupt: the Ctrl-C tests would fail for how the suite was started.
# They test Python's default, so the suite restores it (children inherit it).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Likewise `nohup pytest` (or `setsid nohup ...`) starts it with SIGHUP and perhaps SIGTERM ignored,
# which packer leaves ignored (packer/interrupts.py): the hang-up tests test the default.
for _signum in (signal.SIGHUP, signal.SIGTERM):
    if signal.getsignal(_signum) == signal.SIG_IGN:
        signal.signal(_signum, signal.SIG_DFL)

CLASSES = 3
PER_CLASS = 6
SOURCE_SIZE = (60, 80)  # height, width: small so tests stay fast


class _FixedNow(datetime):
    @classmethod
    def now(cls, tz=None):  # one creation time, so two outputs can be compared byte for byte
        return datetime(2026, 1, 1, tzinfo=tz)


@pytest.fixture
def fixed_clock(monkeypatch):
    """Conversions in this test record one creation time (their metadata's ``created``)."""
    import packer.engine

    monkeypatch.setattr(packer.engine, "datetime", _FixedNow)


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 classes x 6 JPEGs of 80x60: class_00 .. class_02."""
    return make_image_folder(tmp_path_factory.mktemp("src") / "images", classes=CLASSES, per_class=PER_CLASS, size=SOURCE_SIZE)


@pytest.fixture(scope="session")
def lmdb_32(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``image_folder`` converted to LMDB at 32x32, raw, one worker."""
    dst = tmp_path_factory.mktemp("lmdb") / "data.lmdb"
    convert(image_folder, dst, image=ImageOptions(size=32), workers=1)
    return dst


#: Destination name suffix per format (webdataset: a folder of shards).
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "webdataset": ".shards", "blob": ".blob"}


def cached_conversions(src, tmp_path_factory: pytest.TempPathFactory, stem: str, size: int):
    """A function ``fmt -> path``: ``src`` converted to ``fmt`` at ``size`` raw, once per format."""
    made: dict[str, Path] = {}

    def get(fmt: str) -> Path:
        if fmt not in made:
            dst = tmp_path_factory.mktemp(fmt) / f"{stem}{SUFFIX[fmt]}"
            convert(src, dst, format=fmt, image=ImageOptions(size=size), workers=1)
            made[fmt] = dst
        return made[fmt]

    return get


@pytest.fixture(scope="session")
def packed_32(image_folder: Path, tmp_path_factory: pytest.TempPathFactory):
    """A function ``fmt -> path``: ``image_folder`` converted to ``fmt`` at 32x32 raw (cached)."""
    return cached_conversions(image_folder, tmp_path_factory, "data", 32)


@pytest.fixture(scope="session")
def with_bad(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``image_folder`` plus two undecodable files (inputs 3 and 13 in scan order): later keys are renumbered."""
    src = tmp_path_factory.mktemp("bad") / "src"
    shutil.copytree(image_folder, src)
    (src / "class_00" / "000_bad.jpg").write_bytes(b"not an image")
    (src / "class_01" / "zzz_bad.jpg").write_bytes(b"not an image either")
    return src


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 and an s3fs filesystem pointed at it (never any other address)."""
    pytest.importorskip("s3fs", reason="S3 tests need: pip install 'packer[remote]' 'moto[server]'")
    moto_server = pytest.importorskip("moto.server", reason="S3 tests need: pip install 'moto[server]'")
    import os

    import s3fs

    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address=LOOPBACK, port=port, verbose=False)
    server.start()
    endpoint = f"http://{LOOPBACK}:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_ENDPOINT_URL=endpoint, AWS_DEFAULT_REGION="us-east-1")
    s3fs.S3FileSystem.clear_instance_cache()
    restart_worker_server()  # conversion workers read a URL SRC themselves: they need this endpoint
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
    if not fs.exists("packer-test"):  # moto keeps its buckets per process, across servers
        fs.mkdir("packer-test")
    yield fs
    s3fs.S3FileSystem.clear_instance_cache()
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    restart_worker_server()
