"""Shared fixtures: small generated image folders and conversions of them (nothing is shipped)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from datetime import datetime
import signal
from pathlib import Path

import pytest

from packer import ImageOptions, convert
from packer.samples import make_image_folder
from loopback import LOOPBACK, free_port, restart_worker_server
from unprivileged import SHARED_TMP

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

#: Tests that start a Ray instance of their own (``ray.init``, ``--executor ray``): under
#: pytest-xdist (README: the test command) they run one at a time, on one worker, as Ray instances
#: on one machine share its ports and its temporary folder's ``ray/session_latest``.
RAY_TESTS = re.compile(r"tests/test_(quiet_)?ray\.py::|::test_(\w*_)?ray(_|\b)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if RAY_TESTS.search(item.nodeid):
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(scope="session", autouse=True)
def worker_temp_folder():
    """Under pytest-xdist each worker process gets a temporary folder of its own (``TMPDIR``,
    which the conversions' children inherit): a conversion to a URL stages in a folder named by
    its URL under it (``packer/remote.py``, ``staging_folder``), and tests of two workers
    converting to the same bucket path would otherwise take the same folder's lock. A short
    name beside the usual one: a forkserver's socket (``pymp-*/listener-*``) in a benchmark's
    folder in it must stay within the 107 bytes of a Unix socket's name; Ray keeps the usual
    folder (``RAY_TMPDIR``) for its sockets."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        yield None
        return
    saved = {name: os.environ.get(name) for name in ("TMPDIR", "RAY_TMPDIR", SHARED_TMP)}
    folder = tempfile.mkdtemp(prefix=f"pk-{os.environ['PYTEST_XDIST_WORKER']}-")
    os.environ.setdefault("RAY_TMPDIR", tempfile.gettempdir())
    os.environ[SHARED_TMP] = tempfile.gettempdir()  # (tests/unprivileged.py: other users enter folders made there)
    os.environ["TMPDIR"], tempfile.tempdir = folder, None
    yield Path(folder)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile.tempdir = None
    for entry in Path(folder).iterdir():  # (multiprocessing removes its own pymp-* folder as the process exits)
        if not entry.name.startswith("pymp-"):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    import multiprocessing.util

    # then the folder, after multiprocessing's own clean-up (exit priority -100) at exit
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(folder,), kwargs={"ignore_errors": True}, exitpriority=-200)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A report's captured output and log as UTF-8 that can be sent: pytest-xdist sends each
    report from its worker as UTF-8, and a test of names that are not (``b"caf\\xe9"``, read
    back as surrogates) logs them; unsent, the run stopped with an internal error."""
    outcome = yield
    report = outcome.get_result()
    report.sections = [(title, text.encode("utf-8", "backslashreplace").decode("utf-8")) for title, text in report.sections]


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
