"""Remote storage on loopback servers only: shards streamed over HTTP (http.server thread) and
written to / read from S3 (moto's ThreadedMotoServer on 127.0.0.1)."""

from __future__ import annotations

import functools
import http.server
import socket
import threading
from pathlib import Path

import pytest
import torch

from packer import ImageOptions, StorageOptions, convert
from packer.errors import OptionError, OutputError
from readers import ShardDataset
from readers.webdataset import StreamingShards

LOOPBACK = "127.0.0.1"


@pytest.fixture(scope="module")
def shards(image_folder, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("remote") / "shards"
    convert(image_folder, dst, format="webdataset", image=ImageOptions(size=16), storage=StorageOptions(shard_size=4), workers=1)
    return dst


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def http_root(shards):
    """``shards``' parent served by http.server on 127.0.0.1 (a thread), stopped afterwards."""
    handler = functools.partial(_QuietHandler, directory=str(shards.parent))
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{LOOPBACK}:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # noqa: D102 - no request log in test output
        pass


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
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
    fs.mkdir("packer-test")
    yield fs
    s3fs.S3FileSystem.clear_instance_cache()
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


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

    monkeypatch.setattr(remote, "_filesystem", lambda url: (s3, url.split("://", 1)[1]))
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
