"""Remote storage on loopback servers only: shards streamed over HTTP (http.server thread) and
written to / read from S3 (moto's ThreadedMotoServer on 127.0.0.1); image folders streamed
from S3, HTTP and file:// URLs as SRC."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from packer import ImageOptions, StorageOptions, convert
from packer.cli import cli
from packer.errors import OptionError, OutputError, SourceError
from readers import ShardDataset
from readers.formats import open_store
from readers.webdataset import StreamingShards
from checkpoints import convert_until_checkpoint, inputs_converted

from loopback import LOOPBACK, HTTPServer, QuietHandler, served


@pytest.fixture(scope="module")
def shards(image_folder, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("remote") / "shards"
    convert(image_folder, dst, format="webdataset", image=ImageOptions(size=16), storage=StorageOptions(shard_size=4), workers=1)
    return dst


@pytest.fixture(scope="module")
def http_root(shards):
    """``shards``' parent served over HTTP for the module."""
    with served(shards.parent) as url:
        yield url


def pixels(stream) -> list[bytes]:
    return [x.numpy().tobytes() for x, _ in stream]


def test_streaming_shards_over_http(shards, http_root, tmp_path):
    local = ShardDataset(shards)
    expected = [local[i][0].numpy().tobytes() for i in range(len(local))]
    remote = StreamingShards(f"{http_root}/shards/")  # a folder URL: the metadata lists the shards
    assert len(remote) == 18 and pixels(remote) == expected
    braces = StreamingShards(f"{http_root}/shards/shard-{{000000..000004}}.tar")
    assert len(braces) == 18 and pixels(braces) == expected  # metadata found beside the shards
    cached = StreamingShards(f"{http_root}/shards/", cache_dir=tmp_path / "cache", cache_bytes=3 * 4096 * 4)
    assert pixels(cached) == expected and pixels(cached) == expected
    assert 0 < cached.cache.bytes <= cached.cache.max_bytes  # bounded: older shards were evicted
    labels = [y for _, y in StreamingShards(f"{http_root}/shards/")]
    assert labels == [local[i][1] for i in range(18)]


def test_a_server_that_cannot_be_reached_or_refuses_is_one_line(shards, http_root, monkeypatch):
    """Nothing listening, or a shard list longer than the folder's: a one-line OSError naming
    the URL and a ValueError naming the shard, where urllib's URLError and a TypeError came
    (a walkthrough)."""
    import socket

    import readers.remote

    monkeypatch.setattr(readers.remote, "RETRY_DELAY", 0.01)

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(OSError, match=rf"^http://127.0.0.1:{port}/shards/packer.json: cannot be read \(.*refused"):
        StreamingShards(f"http://127.0.0.1:{port}/shards/")
    with pytest.raises(ValueError, match=r"shard 'shard-000005.tar' is not listed in the metadata \(is the shard list"):
        StreamingShards(f"{http_root}/shards/shard-{{000000..000009}}.tar", batch_size=2)


def test_a_sink_beside_a_url_dst_is_refused(s3, image_folder):
    """A URL DST writes through a sink of its own: a caller's was dropped without a word."""
    with pytest.raises(OptionError, match="sink: a URL DST is written through a sink of its own"):
        convert(image_folder, "s3://packer-test/refused", format="webdataset", image=ImageOptions(size=16), workers=1, sink=object())
    assert not s3.exists("packer-test/refused")


def test_webdataset_to_s3_and_streamed_back(s3, image_folder, shards, tmp_path):
    report = convert(image_folder, "s3://packer-test/train", format="webdataset", image=ImageOptions(size=16),
                     storage=StorageOptions(shard_size=4), workers=1)
    assert report.written == 18 and str(report.dst) == "s3://packer-test/train"
    names = sorted(p.rsplit("/", 1)[-1] for p in s3.ls("packer-test/train"))
    assert names == sorted(p.name for p in shards.iterdir())
    for name in names:
        if name != "packer.json":
            assert s3.cat(f"packer-test/train/{name}") == (shards / name).read_bytes(), name
    stream = StreamingShards("s3://packer-test/train", cache_dir=tmp_path / "cache", cache_bytes=1 << 20)
    local = ShardDataset(shards)
    assert len(stream) == 18 and pixels(stream) == [local[i][0].numpy().tobytes() for i in range(18)]
    with pytest.raises(OutputError, match="already exists"):
        convert(image_folder, "s3://packer-test/train", format="webdataset", image=ImageOptions(size=16))


def test_blob_to_s3_and_src_from_s3(s3, image_folder, tmp_path):
    s3.put(str(image_folder) + "/", "packer-test/src/", recursive=True)
    report = convert("s3://packer-test/src", "s3://packer-test/data.blob", image=ImageOptions(size=8), workers=1)
    assert report.written == 18
    local = convert(image_folder, tmp_path / "local.blob", image=ImageOptions(size=8), workers=1)
    from readers.open import open_dataset

    s3.get("packer-test/data.blob", str(tmp_path / "fetched.blob"))
    a, b = open_dataset(tmp_path / "fetched.blob"), open_dataset(local.dst)
    assert all(torch.equal(a[i][0], b[i][0]) and a[i][1] == b[i][1] for i in range(18))
    with pytest.raises(OptionError, match="remote DST"):
        convert(image_folder, "s3://packer-test/x.lmdb", image=ImageOptions(size=8))


def test_shards_are_uploaded_while_converting(s3, image_folder, monkeypatch):
    """Each published shard goes up before the conversion ends; the metadata goes up last."""
    import packer.remote as remote

    order: list[str] = []
    real_put = s3.put_file

    def put_file(lpath, rpath, *args, **kwargs):
        order.append(rpath.rsplit("/", 1)[-1])
        return real_put(lpath, rpath, *args, **kwargs)

    monkeypatch.setattr(remote, "dst_filesystem", lambda url: (s3, url.split("://", 1)[1]))
    monkeypatch.setattr(s3, "put_file", put_file)
    import time

    from packer.writers import webdataset as wds

    real_add = wds.ShardWriter.add_piece

    def slow_add(self, result):  # give the upload thread time to see each shard as it is published
        out = real_add(self, result)
        time.sleep(0.3)
        return out

    monkeypatch.setattr(wds.ShardWriter, "add_piece", slow_add)
    real_finish = wds.ShardWriter.finish

    def finish(self, meta):
        order.append("<finish>")
        return real_finish(self, meta)

    monkeypatch.setattr(wds.ShardWriter, "finish", finish)
    report = convert(image_folder, "s3://packer-test/pattern/train-%04d.tar", format="webdataset", image=ImageOptions(size=8),
                     storage=StorageOptions(shard_size=6), workers=1)
    assert report.written == 18
    assert order[-1] == "packer.json"
    assert order.index("train-0000.tar") < order.index("train-0001.tar") < order.index("<finish>")  # uploaded while converting
    assert len(StreamingShards("s3://packer-test/pattern")) == 18


# -- a URL SRC: listed once, each object read by the worker converting it, never copied whole --
FORMATS = {"lmdb": "x.lmdb", "hdf5": "x.h5", "blob": "x.blob", "webdataset": "x.shards"}


@pytest.fixture(scope="module")
def local_source(image_folder, tmp_path_factory) -> Path:
    """``image_folder`` plus a corrupt image, a stray image outside any class, a hidden folder
    and a text file (the last two ignored)."""
    src = tmp_path_factory.mktemp("stream") / "src"
    shutil.copytree(image_folder, src)
    (src / "class_01" / "zzz_bad.jpg").write_bytes(b"not an image")
    (src / "stray.jpg").write_bytes((src / "class_00" / "img_00000.jpg").read_bytes())
    (src / "class_02" / ".hidden").mkdir()
    (src / "class_02" / ".hidden" / "x.jpg").write_bytes((src / "class_00" / "img_00001.jpg").read_bytes())
    (src / "class_00" / "notes.txt").write_text("not an image")
    return src


@pytest.fixture(scope="module")
def s3_source(s3, local_source) -> str:
    """``local_source`` uploaded to s3://packer-test/stream."""
    s3.put(str(local_source) + "/", "packer-test/stream/", recursive=True)
    return "s3://packer-test/stream"


def samples(path) -> list[tuple[int, tuple, bytes]]:
    store = open_store(path)
    return [(label, tuple(shape), bytes(payload)) for label, shape, payload in store._records(range(len(store)))]


def meta(path) -> dict:
    data = open_store(path).meta.to_dict()
    return {k: v for k, v in data.items() if k not in ("created", "source")}


def same_conversion(url_dst: Path, local_dst: Path) -> None:
    """Byte-identical samples (labels included) and metadata apart from time and source."""
    assert samples(url_dst) == samples(local_dst) and len(samples(url_dst)) == 18
    assert meta(url_dst) == meta(local_dst)


def no_copy(*args, **kwargs):
    raise AssertionError("the remote SRC was copied")


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_s3_src_is_streamed_like_the_local_folder(s3, s3_source, local_source, tmp_path, monkeypatch, fmt):
    import fsspec.asyn
    import fsspec.spec

    import packer.remote

    for owner, name in [(fsspec.spec.AbstractFileSystem, "get"), (fsspec.asyn.AsyncFileSystem, "_get"), (packer.remote, "remote_destination")]:
        monkeypatch.setattr(owner, name, no_copy)  # nothing fetched whole, nothing staged
    storage = StorageOptions(shard_size=4) if fmt == "webdataset" else None
    report = convert(s3_source, tmp_path / FORMATS[fmt], format=fmt, image=ImageOptions(size=16), storage=storage, workers=2)
    local = convert(local_source, tmp_path / f"local-{FORMATS[fmt]}", format=fmt, image=ImageOptions(size=16), storage=storage, workers=2)
    same_conversion(report.dst, local.dst)
    assert open_store(report.dst).meta.source == "s3://packer-test/stream"
    assert report.skipped == local.skipped and [s.path for s in report.skipped] == ["stray.jpg", "class_01/zzz_bad.jpg"]
    assert "not a readable image" in report.skipped[1].reason
    if fmt == "webdataset":  # shards, index and checksums byte for byte
        names = sorted(p.name for p in local.dst.iterdir())
        assert names == sorted(p.name for p in report.dst.iterdir()) and len(names) > 4
        for name in names:
            if name != "packer.json":
                assert (report.dst / name).read_bytes() == (local.dst / name).read_bytes(), name


def test_file_url_src(local_source, tmp_path):
    report = convert(f"file://{local_source}", tmp_path / "f.lmdb", image=ImageOptions(size=16), workers=2)
    local = convert(local_source, tmp_path / "l.lmdb", image=ImageOptions(size=16), workers=2)
    same_conversion(report.dst, local.dst)
    assert open_store(report.dst).meta.source == f"file://{local_source}"
    assert report.skipped == local.skipped


def test_a_url_src_of_text_files_says_text_is_read_locally_only(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("some text")
    pytest.importorskip("aiohttp", reason="fsspec reads http(s):// URLs with aiohttp")
    with served(tmp_path) as root, pytest.raises(SourceError, match=r"no images found at its top level .*; it holds text files, and "
                                                                    r"text corpora are read from local folders only so far: copy it locally first$"):
        convert(f"{root}/corpus", tmp_path / "t.blob")


def test_a_file_url_src_that_is_read_locally_is_its_local_path(tmp_path):
    """file://corpus was refused as a URL ('text corpora are read from local folders only') though it is one."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("some text\nmore\n")
    result = CliRunner().invoke(cli, ["convert", f"file://{corpus}", str(tmp_path / "t.blob"), "--lines", "-q"])
    assert result.exit_code == 0, result.output
    assert open_store(tmp_path / "t.blob").meta.count == 2 and open_store(tmp_path / "t.blob").meta.source == str(corpus)


def test_a_file_url_dst_is_read_back_by_the_same_url(local_source, tmp_path):
    """packer convert writes to file:// URLs; every reader, packer info and verify read them there
    too (info said "file:/...: no such packed dataset", StreamingShards raised IsADirectoryError)."""
    url = f"file://{tmp_path}/sh"
    report = convert(local_source, url, format="webdataset", image=ImageOptions(size=8), workers=1)
    names = sorted(n for n in tarfile.open(tmp_path / "sh" / "shard-000000.tar").getnames() if n.endswith(".npy"))
    for source in (url, url + "/", f"{url}/shard-{{000000..000000}}.tar", [f"{url}/shard-000000.tar"]):
        stream = StreamingShards(source)
        assert len(stream) == report.written == len(list(stream)) == len(names), source
    assert len(ShardDataset(url)) == report.written
    for command in (["info", url], ["verify", url]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 0 and f"{tmp_path}/sh" in result.output, result.output
    pattern = f"file://{tmp_path}/pat/train-%06d.tar"  # a pattern DST: read back by the same URL, %06d and all
    convert(local_source, pattern, image=ImageOptions(size=8), workers=1)
    assert len(StreamingShards(f"file://{tmp_path}/pat")) == report.written
    for same in (pattern, f"{tmp_path}/pat/train-%06d.tar"):  # the DST as given, as ShardDataset and open_dataset take it
        assert len(StreamingShards(same)) == len(ShardDataset(same)) == report.written
    result = CliRunner().invoke(cli, ["info", pattern])
    assert result.exit_code == 0 and f"{tmp_path}/pat" in result.output, result.output


@pytest.mark.parametrize("fmt, name", [("lmdb", "d.lmdb"), ("hdf5", "d.h5"), ("blob", "d.blob")])
def test_every_reader_takes_a_file_url(local_source, tmp_path, fmt, name):
    """LMDBDataset, HDF5Dataset and open_dataset said "no such ... dataset" for the file:// URL
    packer convert wrote to, which ShardDataset and RAMDataset read (a Streaming user's
    walkthrough); ``file://localhost/`` is the same path (RFC 8089)."""
    from readers import open_dataset

    report = convert(local_source, f"file://{tmp_path}/{name}", format=fmt, image=ImageOptions(size=8), workers=1)
    plain = open_dataset(tmp_path / name)
    expected = plain.read_batch(np.arange(len(plain)))[0]
    del plain
    for url in (f"file://{tmp_path}/{name}", f"file://localhost{tmp_path}/{name}"):
        ds = open_dataset(url)
        assert len(ds) == report.written and np.array_equal(np.asarray(ds.read_batch(np.arange(len(ds)))[0]), np.asarray(expected)), url
        del ds


def test_http_src(local_source, tmp_path):
    pytest.importorskip("aiohttp", reason="fsspec reads http(s):// URLs with aiohttp")
    with served(local_source.parent) as root:
        url = f"{root}/src"
        report = convert(url, tmp_path / "h.lmdb", image=ImageOptions(size=16), workers=2)
    local = convert(local_source, tmp_path / "l.lmdb", image=ImageOptions(size=16), workers=2)
    same_conversion(report.dst, local.dst)
    assert open_store(report.dst).meta.source == url and report.skipped == local.skipped


def test_an_http_src_with_a_symlink_loop_is_not_walked_forever(local_source, tmp_path):
    """A server that follows symlinks shows ``class_00/loop -> ..`` as endless folders: every
    class's images again under class_00, labelled class_00, for minutes (a data engineer's
    walkthrough: 24,680 images from 601). The loop is cut and recorded, as a local scan does."""
    pytest.importorskip("aiohttp", reason="fsspec reads http(s):// URLs with aiohttp")
    from packer.sources.remote import LOOP_REASON

    src = tmp_path / "www" / "src"
    shutil.copytree(local_source, src, symlinks=True)
    os.symlink("..", src / "class_00" / "loop")
    with served(src.parent) as root:
        report = convert(f"{root}/src", tmp_path / "h.lmdb", image=ImageOptions(size=16), workers=2)
    plain = convert(local_source, tmp_path / "l.lmdb", image=ImageOptions(size=16), workers=2)
    assert report.written == plain.written
    assert ("class_00/loop", LOOP_REASON) in [(s.path, s.reason) for s in report.skipped]
    as_file_url = convert(f"file://{src}", tmp_path / "f.lmdb", image=ImageOptions(size=16), workers=2)  # fsspec does not enter the link
    assert as_file_url.written == plain.written


def test_an_object_that_cannot_be_read_is_skipped_or_stops_naming_its_url(s3, local_source, tmp_path, monkeypatch):
    """An object gone between the listing and its read: recorded by its relative path, or (with
    --on-error fail) one error line naming its URL."""
    import packer.jobs

    real_scan = packer.jobs.scan_image_folder

    def scan_then_delete(src):
        folder = real_scan(src)
        s3.rm("packer-test/gone/class_00/img_00002.jpg")
        return folder

    monkeypatch.setattr(packer.jobs, "scan_image_folder", scan_then_delete)
    s3.put(str(local_source) + "/", "packer-test/gone/", recursive=True)
    report = convert("s3://packer-test/gone", tmp_path / "g.lmdb", image=ImageOptions(size=16), workers=2)
    assert report.written == 17
    assert [s.path for s in report.skipped] == ["stray.jpg", "class_00/img_00002.jpg", "class_01/zzz_bad.jpg"]
    assert report.skipped[1].reason.startswith("cannot read (FileNotFoundError")
    s3.put(str(local_source / "class_00" / "img_00002.jpg"), "packer-test/gone/class_00/img_00002.jpg")
    result = CliRunner().invoke(cli, ["convert", "s3://packer-test/gone", str(tmp_path / "h.lmdb"), "--size", "16", "--on-error", "fail", "-q"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and errors[0].startswith("Error: s3://packer-test/gone/class_00/img_00002.jpg: cannot read (FileNotFoundError")


def test_remote_reads_retry_transient_errors_only(monkeypatch, image_folder):
    """Connection resets and timeouts are retried; a missing object is not; either way the input
    fails with the reason (no server needed: the filesystem is a stand-in)."""
    import packer.sources.remote as remote_src
    from packer.preprocess.task import Encoded, Failed, ImageTask
    from packer.sources.images import ImageItem

    data = (image_folder / "class_00" / "img_00000.jpg").read_bytes()

    class Flaky:
        def __init__(self, error: BaseException, failures: int) -> None:
            self.error, self.failures, self.calls = error, failures, 0

        def cat_file(self, path: str, **options) -> bytes:
            self.calls += 1
            if self.calls <= self.failures:
                raise self.error
            return data

    monkeypatch.setattr(remote_src, "RETRY_DELAY", 0.0)
    task = ImageTask(ImageOptions(size=8))
    item = ImageItem("s3://bucket/src/a/1.jpg", 0)
    from botocore.exceptions import EndpointConnectionError
    from packer.preprocess.task import UNREACHABLE

    unreached = EndpointConnectionError(endpoint_url="http://127.0.0.1:9")  # (botocore's: not an OSError; it was no retry)
    for error, failures, calls, outcome in [
        (ConnectionResetError(104, "Connection reset by peer"), 2, 3, "sample"),
        (TimeoutError("read timed out"), 5, 3, ("cannot read after 3 attempts (TimeoutError: read timed out)", UNREACHABLE)),
        (unreached, 5, 3, (f"cannot read after 3 attempts (EndpointConnectionError: {unreached})", UNREACHABLE)),
        (OSError(5, "odd object"), 5, 3, "cannot read after 3 attempts (OSError: [Errno 5] odd object)"),  # (its own: skipped)
        (FileNotFoundError("bucket/src/a/1.jpg"), 5, 1, "cannot read (FileNotFoundError: bucket/src/a/1.jpg)"),
        (RuntimeError("odd backend\nsecond line"), 5, 1, "cannot read (RuntimeError: odd backend)"),
    ]:
        fs = Flaky(error, failures)
        monkeypatch.setattr(remote_src, "_filesystem_for", lambda url, fs=fs: (fs, url))
        result = task(item)
        assert fs.calls == calls, error
        if outcome == "sample":
            assert isinstance(result, Encoded) and result.shape == (3, 8, 8)
        else:
            assert result == Failed(item.path, *((outcome,) if isinstance(outcome, str) else outcome)), result


@pytest.mark.parametrize(
    "url, message",
    [
        ("s3://no-such-bucket-here/train", "no such folder"),
        ("s3://packer-test/no/such/prefix", "no such folder"),
        ("s3://packer-test/texts", "no images found at its top level"),
        ("s3://packer-test/texts/a.txt", "is a file"),
    ],
)
def test_unusable_src_url_is_one_error_line(s3, tmp_path, url, message):
    s3.pipe("packer-test/texts/a.txt", b"no images here")
    result = CliRunner().invoke(cli, ["convert", url, str(tmp_path / "x.lmdb"), "--size", "8"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith(f"Error: {url}: {message}") and result.output.count("\n") == 1
    assert not (tmp_path / "x.lmdb").exists()


def test_resume_from_an_s3_src(s3, local_source, tmp_path, monkeypatch):
    """A conversion from S3 that dies after a checkpoint resumes from the listing's fingerprint:
    only the rest is converted, the result equals an uninterrupted run's, and a changed listing
    is refused."""
    import packer.parallel
    import packer.writers.journal as journal
    from packer.writers.base import Writer

    s3.put(str(local_source) + "/", "packer-test/resume/", recursive=True)
    url, dst = "s3://packer-test/resume", tmp_path / "r.lmdb"
    partial = dst.with_name("r.lmdb.partial")

    class Died(Exception):
        pass

    real_progress = Writer.progress

    def die_after_8(self, inputs, skipped):
        real_progress(self, inputs, skipped)
        if inputs == 8:
            raise Died

    with monkeypatch.context() as m:
        m.setattr(journal, "CHECKPOINT_SECONDS", 0.0)  # a checkpoint after every input
        m.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
        m.setattr(Writer, "progress", die_after_8)
        # as if killed: DST.partial and its journal stay, and the lock goes with the process
        m.setattr(Writer, "abort", lambda self: (self._close(), self._lock.release()))
        with pytest.raises(Died):
            convert(url, dst, image=ImageOptions(size=16), workers=2)
    assert partial.exists() and not dst.exists()
    # the last checkpoint: the one at input 8, or one just before it if that commit was still
    # running in the background when the process "died" (a kill loses it: the journal says so)
    saved = json.loads((journal.journal_path(partial) / "journal.json").read_text())["inputs"]
    assert 1 <= saved <= 8

    s3.pipe("packer-test/resume/class_00/new.jpg", (local_source / "class_00" / "img_00000.jpg").read_bytes())
    with pytest.raises(OptionError, match="the source folder changed"):
        convert(url, dst, image=ImageOptions(size=16), workers=2, resume=True)
    s3.rm("packer-test/resume/class_00/new.jpg")

    with inputs_converted(monkeypatch, packer.parallel) as converted:
        report = convert(url, dst, image=ImageOptions(size=16), workers=2, resume=True)
    assert converted == [19 - saved]  # 19 inputs in class folders; `saved` were done
    local = convert(local_source, tmp_path / "l.lmdb", image=ImageOptions(size=16), workers=2)
    same_conversion(report.dst, local.dst)
    assert report.skipped == local.skipped and not partial.exists()


def test_verify_against_an_s3_source(s3, s3_source, local_source, tmp_path):
    """`packer verify DST --source s3://...` re-runs the preprocessing on the objects, as a user
    types it; an object replaced since the conversion is named."""
    dst = tmp_path / "v.lmdb"
    convert(s3_source, dst, image=ImageOptions(size=16), workers=2)
    result = CliRunner().invoke(cli, ["verify", str(dst), "--source", s3_source, "-j", "2"])
    assert result.exit_code == 0, result.output
    assert "18 compared with the source" in result.output
    s3.copy("packer-test/stream", "packer-test/changed", recursive=True)
    s3.copy("packer-test/stream/class_00/img_00001.jpg", "packer-test/changed/class_00/img_00000.jpg")
    result = CliRunner().invoke(cli, ["verify", str(dst), "--source", "s3://packer-test/changed", "-j", "2"])
    assert result.exit_code == 1 and "fault: sample 0 <- class_00/img_00000.jpg: changed: raw pixels differ" in result.output


def test_s3_src_on_ray(s3, s3_source, local_source, tmp_path):
    """Ray tasks read the objects themselves (a local Ray instance started here inherits the
    endpoint from this process's environment)."""
    ray = pytest.importorskip("ray", reason="the Ray executor needs: pip install 'packer[ray]'")
    if ray.is_initialized():
        pytest.skip("Ray is already running in this process (with another environment)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address=LOOPBACK)  # loopback only
    try:
        report = convert(s3_source, tmp_path / "ray.lmdb", image=ImageOptions(size=16), executor="ray")
    finally:
        ray.shutdown()
    local = convert(local_source, tmp_path / "l.lmdb", image=ImageOptions(size=16), workers=2)
    same_conversion(report.dst, local.dst)
    assert report.skipped == local.skipped and open_store(report.dst).meta.source == s3_source


# -- a URL DST: shards uploaded as published and deleted locally, metadata last ------------------
def staged_files(url: str) -> tuple[int, int]:
    """(published shards, all shard files) in the local staging folder of a conversion to ``url``."""
    from packer.remote import staging_folder

    names = [p.name for p in staging_folder(url).rglob("*.tar")]
    return sum(not n.startswith(".") for n in names), len(names)


@pytest.fixture(scope="module")
def many_images(tmp_path_factory) -> Path:
    """60 tiny JPEGs in 2 classes: 30 shards of 2."""
    from packer.samples import make_image_folder

    return make_image_folder(tmp_path_factory.mktemp("many") / "src", classes=2, per_class=30, size=(12, 16))



def meta_without_time(data: bytes) -> dict:
    import json

    meta = json.loads(data)
    meta.pop("created")
    return meta


def assert_same_output(fs, root: str, local: Path) -> None:
    """Every file at ``root`` (on ``fs``) equals ``local``'s, the metadata apart from ``created``."""
    fs.invalidate_cache()
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root))
    assert names == sorted(p.name for p in local.iterdir())
    for name in names:
        remote, here = fs.cat(f"{root}/{name}"), (local / name).read_bytes()
        assert (meta_without_time(remote) == meta_without_time(here)) if name == "packer.json" else remote == here, name


def test_local_disk_holds_only_the_shards_waiting_for_upload(s3, many_images, tmp_path, monkeypatch):
    """With uploads slower than the conversion, at most MAX_PENDING published shards (+1 being
    handed over) exist locally at any moment: the conversion waits for the network instead of
    filling the disk. The output equals a local conversion's; the metadata goes up last."""
    import time

    import packer.remote as remote

    url = "s3://packer-test/bounded"
    stored: list[str] = []
    stored_before_metadata: list[str] = []
    seen: list[tuple[int, int]] = []
    real_put = s3.put_file

    def slow_put(lpath, rpath, *args, **kwargs):
        seen.append(staged_files(url))
        name = rpath.rsplit("/", 1)[-1]
        if name == "packer.json":
            stored_before_metadata.extend(stored)
        time.sleep(0.03)
        real_put(lpath, rpath, *args, **kwargs)
        stored.append(name)

    real_queue = remote.Uploader.put

    def put(self, path):
        seen.append(staged_files(url))
        return real_queue(self, path)

    monkeypatch.setattr(remote, "dst_filesystem", lambda u: (s3, u.split("://", 1)[1]))
    monkeypatch.setattr(s3, "put_file", slow_put)
    monkeypatch.setattr(remote.Uploader, "put", put)
    options = dict(format="webdataset", image=ImageOptions(size=8), storage=StorageOptions(shard_size=2), workers=1)
    report = convert(many_images, url, **options)
    assert report.written == 60 and str(report.dst) == url
    published, files = max(p for p, _ in seen), max(f for _, f in seen)
    assert remote.MAX_PENDING <= published <= remote.MAX_PENDING + 1  # back-pressure engaged, and held
    assert files <= remote.MAX_PENDING + 1 + (4 * 1 + 2) + 1  # + the pool's window of pieces ahead (packer/parallel.py)
    assert files < 30 // 2
    # the metadata upload starts only once every other file is stored (two upload threads run at once)
    assert stored[-1] == "packer.json" and sorted(stored_before_metadata) == sorted(stored[:-1])
    assert {"packer-index.npy", "packer-crc32.npy", "packer-sources.json", "wids-index.json"} <= set(stored_before_metadata) and len(stored) == 30 + 5
    assert not remote.staging_folder(url).exists()
    assert_same_output(s3, "packer-test/bounded", convert(many_images, tmp_path / "local", **options).dst)


@pytest.mark.parametrize("scheme", ["s3", "file"])
def test_url_output_is_byte_identical_to_a_local_conversion(s3, with_bad, tmp_path, scheme):
    """Same shard names, keys (renumbered after skipped inputs), bytes, index and checksums."""
    import fsspec

    options = dict(format="webdataset", image=ImageOptions(size=16), storage=StorageOptions(shard_size=4), workers=2)
    local = convert(with_bad, tmp_path / "local", **options)
    url = "s3://packer-test/same" if scheme == "s3" else (tmp_path / "remote" / "same").as_uri()
    report = convert(with_bad, url, **options)
    assert report.written == local.written == 18 and [s.path for s in report.skipped] == [s.path for s in local.skipped]
    fs, root = fsspec.core.url_to_fs(url) if scheme == "file" else (s3, "packer-test/same")
    assert_same_output(fs, root, local.dst)


def test_failed_conversion_removes_its_uploads(s3, many_images, monkeypatch):
    from packer import remote
    from packer.writers import webdataset as wds

    real_add = wds.ShardWriter.add_piece
    calls = []

    def failing_add(self, result):
        calls.append(1)
        if len(calls) == 4:
            self.sink.flush()  # three shards are uploaded by now
            assert len(self.sink.stored()) == 3
            raise RuntimeError("disk on fire")
        return real_add(self, result)

    monkeypatch.setattr(wds.ShardWriter, "add_piece", failing_add)
    url = "s3://packer-test/failed"
    with pytest.raises(RuntimeError, match="disk on fire"):
        convert(many_images, url, format="webdataset", image=ImageOptions(size=8), storage=StorageOptions(shard_size=2), workers=1)
    s3.invalidate_cache()
    assert not s3.exists("packer-test/failed") and not remote.staging_folder(url).exists()


def test_a_failed_upload_stops_the_conversion_and_removes_the_rest(s3, many_images, monkeypatch):
    from packer import remote

    real_put = s3.put_file
    calls = []

    def flaky_put(lpath, rpath, *args, **kwargs):
        calls.append(rpath)
        if len(calls) == 5:
            raise ConnectionError("connection reset by peer")
        return real_put(lpath, rpath, *args, **kwargs)

    monkeypatch.setattr(remote, "dst_filesystem", lambda u: (s3, u.split("://", 1)[1]))
    monkeypatch.setattr(s3, "put_file", flaky_put)
    url = "s3://packer-test/flaky"
    with pytest.raises(OutputError, match="upload failed .connection reset by peer.*readers refuse"):
        convert(many_images, url, format="webdataset", image=ImageOptions(size=8), storage=StorageOptions(shard_size=2), workers=1)
    s3.invalidate_cache()
    assert not s3.exists("packer-test/flaky") and not remote.staging_folder(url).exists()


@pytest.mark.parametrize("shard_size, workers", [(4, None), (100, 2)])  # (100, 2): one piece, in fragments
def test_ray_to_s3_returns_shards_to_the_driver(s3, with_bad, tmp_path, monkeypatch, shard_size, workers):
    """--executor ray with a URL DST: the tasks never see the driver's staging folder (they get
    no path and return their shards' bytes, or fragments' member streams), and the output equals
    a local-pool conversion's."""
    ray = pytest.importorskip("ray", reason="the Ray executor needs: pip install 'packer[ray]'")
    import packer.executors.ray as ray_executor
    from packer.remote import staging_folder

    tasks = []
    real = ray_executor.ray_ordered_map

    def spy(fn, items, **options):
        tasks.append(fn)
        return real(fn, items, **options)

    monkeypatch.setattr(ray_executor, "ray_ordered_map", spy)
    options = dict(format="webdataset", image=ImageOptions(size=16), storage=StorageOptions(shard_size=shard_size))
    local = convert(with_bad, tmp_path / "local", workers=2, **options)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address=LOOPBACK)  # loopback only
    try:
        report = convert(with_bad, f"s3://packer-test/ray-{shard_size}", executor="ray", workers=workers, **options)
    finally:
        if started:
            ray.shutdown()
    assert report.written == 18 and report.workers == 2
    (task,) = tasks
    staging = str(staging_folder(f"s3://packer-test/ray-{shard_size}").resolve())
    assert task.folder is None and staging.encode() not in ray.cloudpickle.dumps(task)
    assert_same_output(s3, f"packer-test/ray-{shard_size}", local.dst)


def test_sigkill_then_resume_to_s3(s3, tmp_path, monkeypatch):
    """A conversion to s3:// killed with SIGKILL after a checkpoint: the partial upload has no
    metadata (readers refuse it); --resume keeps the shards uploaded by the checkpoint, converts
    only the inputs after it, and the result equals an uninterrupted local run's."""
    import numpy as np

    import packer.parallel as parallel
    from imagefiles import jpeg_bytes, write
    from packer.remote import staging_folder
    from packer.samples import natural_image
    from readers.schema import IncompleteDatasetError

    src = tmp_path / "src"
    data = jpeg_bytes(natural_image(np.random.default_rng(0), 375, 500), quality=90)
    for i in range(240):
        write(src / f"c{i % 2}" / f"{i:04d}.jpg", data if i != 33 else b"not a jpeg")
    url = "s3://packer-test/resumed"
    journal = staging_folder(url) / "resumed.partial-journal" / "journal.json"
    args = ["convert", str(src), url, "-j", "1", "-q", "--size", "24", "-f", "webdataset", "--shard-size", "20"]
    committed = convert_until_checkpoint(args, journal)
    assert 0 < committed < 240
    s3.invalidate_cache()
    assert s3.ls("packer-test/resumed") and not s3.exists("packer-test/resumed/packer.json")
    with pytest.raises(IncompleteDatasetError):
        StreamingShards(url)
    with pytest.raises(OutputError, match="--resume carries it on"):
        convert(src, url, format="webdataset")

    kwargs = dict(format="webdataset", image=ImageOptions(size=24), storage=StorageOptions(shard_size=20), workers=1)
    with inputs_converted(monkeypatch, parallel) as sizes:
        report = convert(src, url, resume=True, **kwargs)
    assert sizes == [240 - committed]  # the shards uploaded by the checkpoint were not redone
    reference = convert(src, tmp_path / "ref.shards", **kwargs)
    assert report.written == reference.written == 239
    assert_same_output(s3, "packer-test/resumed", reference.dst)
    assert not staging_folder(url).exists()


def test_remote_inputs_are_read_ahead_while_decoding(local_source, monkeypatch):
    """``ImageTask.map`` keeps READ_AHEAD reads in flight (threads), never more, and gives the
    same results, in order, as one read at a time; a failed read stays in its place.

    No timing in the assertions: every read of the map waits for a release that comes only once
    READ_AHEAD reads are in flight together (a condition variable; after 30 s without, the
    release comes anyway and the count is short), and a counter under the lock records the most
    in flight at any moment. The short pause before the release only gives a read beyond the
    window the chance to start and be counted: it can make a broken window go unseen, never a
    correct one fail."""
    import threading
    import time

    from packer.preprocess import task as task_module
    from packer.preprocess.task import Failed, ImageTask
    from packer.sources.images import scan_image_folder
    from packer.sources.remote import READ_AHEAD

    local = scan_image_folder(local_source).items
    items = [type(item)(f"s3://fake/{i}.jpg", item.label) for i, item in enumerate(local)]
    files = {item.path: Path(source.path).read_bytes() for item, source in zip(items, local)}
    in_flight, most, held = 0, 0, False
    changed = threading.Condition()
    release = threading.Event()

    def read(url):
        nonlocal in_flight, most
        with changed:
            in_flight += 1
            most = max(most, in_flight)
            changed.notify_all()
        try:
            if held:
                release.wait(timeout=60)
        finally:
            with changed:
                in_flight -= 1
        return Failed(url, "cannot read (gone)") if url.endswith("/5.jpg") else files[url]

    def release_when_the_window_is_full():
        with changed:
            changed.wait_for(lambda: in_flight >= READ_AHEAD, timeout=30)
        time.sleep(0.2)
        release.set()

    monkeypatch.setattr(task_module, "_read_url", read)
    task = ImageTask(ImageOptions(size=16))
    one_at_a_time = [task(item) for item in items]
    assert most == 1 and len(items) > READ_AHEAD + 1
    held, most = True, 0
    releaser = threading.Thread(target=release_when_the_window_is_full)
    releaser.start()
    ahead = list(task.map(items))
    releaser.join()
    assert most == READ_AHEAD  # the window filled, and never more
    assert ahead == one_at_a_time and ahead[5] == Failed("s3://fake/5.jpg", "cannot read (gone)")


def test_a_dataset_replaced_at_its_url_is_not_read_from_the_cache(image_folder, tmp_path):
    """The cache was keyed by URL alone: after --overwrite with --grayscale, every sample came
    back with 3 channels under 1-channel metadata (an S3 walkthrough)."""
    root = tmp_path / "served"
    root.mkdir()
    dst = root / "ds"
    convert(image_folder, dst, format="webdataset", image=ImageOptions(size=8), storage=StorageOptions(shard_size=8), workers=1)
    with served(root) as url:
        first = [x.shape for x, _ in StreamingShards(f"{url}/ds/", cache_dir=tmp_path / "cache")]
        convert(image_folder, dst, format="webdataset", image=ImageOptions(size=8, grayscale=True), storage=StorageOptions(shard_size=8),
                workers=1, overwrite=True)
        again = [x.shape for x, _ in StreamingShards(f"{url}/ds/", cache_dir=tmp_path / "cache")]
    assert {tuple(s) for s in first} == {(3, 8, 8)} and {tuple(s) for s in again} == {(1, 8, 8)} and len(again) == 18


def test_an_http_src_names_files_and_classes_as_the_server_has_them(image_folder, tmp_path):
    """http.server lists `éclair/` and `img 000.jpg` percent-encoded (`%C3%A9clair/`, `img%20000.jpg`):
    classes were named and sorted so, which swapped the labels of 'apple' and 'éclair' against the
    local folder's without a word, and the recorded names were encoded (a remote walkthrough)."""
    pytest.importorskip("aiohttp", reason="fsspec reads http(s):// URLs with aiohttp")
    src = tmp_path / "served" / "src"
    pictures = sorted(image_folder.rglob("*.jpg"))
    for k, name in enumerate(["éclair/img 000.jpg", "éclair/plus+sign.jpg", "éclair/é ü.jpg", "apple/a%20b.jpg", "apple/x.jpg"]):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(pictures[k], src / name)
    local = convert(src, tmp_path / "l.lmdb", image=ImageOptions(size=16), workers=1)
    with served(src.parent) as root:
        remote = convert(f"{root}/src", tmp_path / "h.lmdb", image=ImageOptions(size=16), workers=1)
    assert samples(remote.dst) == samples(local.dst) and len(samples(local.dst)) == 5
    assert open_store(remote.dst).meta.classes == ("apple", "éclair")
    assert open_store(remote.dst).source_names() == open_store(local.dst).source_names()
    assert "éclair/é ü.jpg" in open_store(local.dst).source_names() and "apple/a%20b.jpg" in open_store(local.dst).source_names()


def test_a_url_src_that_is_a_file_says_urls_are_folders_of_images(tmp_path):
    """http://.../part0.jsonl was told SRC may be 'a text corpus (.jsonl...)', which a URL may not be."""
    pytest.importorskip("aiohttp", reason="fsspec reads http(s):// URLs with aiohttp")
    (tmp_path / "part0.jsonl").write_text('{"text": "a"}\n')
    with served(tmp_path) as root, pytest.raises(SourceError) as caught:
        convert(f"{root}/part0.jsonl", tmp_path / "t.blob")
    assert str(caught.value) == (f"{root}/part0.jsonl: is a file; a URL SRC must be a folder of images (class sub-folders = labels): "
                                 "archives, text and Parquet files are read from local paths only so far; copy it locally first")


def test_an_http_src_with_names_that_are_not_utf8_loses_no_image(image_folder, tmp_path):
    """A class folder named in Latin-1 bytes (caf\\xe9): decoded with replacement characters, its
    names could not be asked for again and its images were skipped as missing (a review)."""
    pytest.importorskip("aiohttp", reason="fsspec reads http(s):// URLs with aiohttp")
    src = tmp_path / "served" / "src"
    pictures = sorted(image_folder.rglob("*.jpg"))
    for k, folder in enumerate([os.fsdecode(b"caf\xe9"), "plain"]):
        (src / folder).mkdir(parents=True)
        for j in range(2):
            shutil.copy(pictures[2 * k + j], src / folder / f"{j}.jpg")
    with served(src.parent) as root:
        report = convert(f"{root}/src", tmp_path / "h.lmdb", image=ImageOptions(size=16), workers=1)
    assert report.written == 4 and not report.skipped


class _Stalling(QuietHandler):
    """Lists folders, and answers no request for an image (a stopped server: the kernel accepts)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.endswith(".jpg"):
            time.sleep(4)
            return
        super().do_GET()

    do_HEAD = do_GET


def test_an_http_src_whose_server_stalls_stops_resumably_not_skipping_every_input(image_folder, tmp_path, monkeypatch):
    """Each input of a stalled store timed out in turn and was skipped for good (with --timeout 5;
    at the default, a 60 s stall retried outlasts 120 s too): a Streaming/LitData user's walkthrough.
    An input that times out while its store does not answer now stops the conversion, resumably."""
    pytest.importorskip("aiohttp", reason="fsspec reads http(s):// URLs with aiohttp")
    import packer.sources.remote as remote_src
    from packer.errors import InputError

    monkeypatch.setattr(remote_src, "PROBE_SECONDS", 0.5)
    src = tmp_path / "served" / "src"
    for k, picture in enumerate(sorted(image_folder.rglob("*.jpg"))[:2]):
        (src / "a").mkdir(parents=True, exist_ok=True)
        shutil.copy(picture, src / "a" / f"{k}.jpg")
    server = HTTPServer((LOOPBACK, 0), functools.partial(_Stalling, directory=str(src.parent)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        root = f"http://{LOOPBACK}:{server.server_address[1]}"
        with pytest.raises(InputError, match=r"/src/a/0\.jpg: timed out after 1 s; the conversion stopped: the store did not answer; "
                                             r"once it does, run the same command with --resume"):
            convert(f"{root}/src", tmp_path / "h.lmdb", image=ImageOptions(size=16), workers=1, timeout=1)
        assert not (tmp_path / "h.lmdb").exists()
    finally:
        server.shutdown()
        server.server_close()
    assert remote_src.store_answers(f"{root}/src/a/0.jpg", 0.5) is False  # (gone: refused at once)
    with served(src.parent) as root:  # user:password@ is sent as basic authentication, as the readers send it (a review)
        assert remote_src.store_answers(root.replace("http://", "http://user:p%40ss@") + "/src/a/0.jpg", 5) is True
