"""``packer info URL`` and ``packer verify URL``: a WebDataset or blob that ``packer convert``
wrote to a URL, read in place (readers/formats/remote.py), against a moto S3 server on
127.0.0.1 (the ``s3`` fixture, conftest.py) and a static http.server folder. Every expectation
comes from the plain libraries (s3fs, json, struct, tarfile) or from the same command run on
the same dataset converted to a local path."""

from __future__ import annotations

import json
import struct
import tarfile
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer import ImageOptions, StorageOptions, convert
from packer.cli import cli
from loopback import LOOPBACK, served

BUCKET = "packer-test"
OPTIONS = dict(image=ImageOptions(size=16), workers=1)
SHARDS = dict(format="webdataset", storage=StorageOptions(shard_size=4), **OPTIONS)


class _Then(datetime):
    @classmethod
    def now(cls, tz=None):  # one creation time: the local and the remote conversion record the same
        return datetime(2026, 1, 1, tzinfo=tz)


@pytest.fixture(scope="module")
def pairs(s3, image_folder, tmp_path_factory):
    """The same source converted locally and to S3, as WebDataset shards and as a blob:
    ``{"webdataset": (local path, url), "blob": (local path, url)}``."""
    import packer.engine

    root = tmp_path_factory.mktemp("rinfo")
    name = root.name  # (unique: remote conversions share a staging folder per URL)
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(packer.engine, "datetime", _Then)
        for fmt, suffix, options in (("webdataset", "", SHARDS), ("blob", ".blob", OPTIONS)):
            url = f"s3://{BUCKET}/{name}/{fmt}{suffix}"
            local = convert(image_folder, root / f"{fmt}{suffix}", **options).dst
            convert(image_folder, url, **options)
            out[fmt] = (Path(local), url)
    s3.invalidate_cache()
    return out


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def same_dataset(text: str, local: Path, url: str) -> str:
    """``text`` said of ``url``, as it would be said of ``local`` (the path is the only difference)."""
    return text.replace(url.rstrip("/"), str(local))


def copy_of(s3, url: str, tmp_path: Path) -> str:
    """A copy of the dataset at ``url`` at a fresh URL, to damage."""
    key = url.removeprefix("s3://")
    target = f"{BUCKET}/copies/{tmp_path.name}/{key.rsplit('/', 1)[-1]}"
    s3.copy(key, target, recursive=s3.isdir(key))
    s3.invalidate_cache()
    return f"s3://{target}"


@pytest.mark.parametrize("fmt", ["webdataset", "blob"])
def test_info_of_a_url_is_the_local_info_of_the_same_dataset(pairs, fmt):
    local, url = pairs[fmt]
    there, here = run("info", url), run("info", str(local))
    assert there.exit_code == 0, there.output
    assert same_dataset(there.output, local, url) == here.output
    assert there.output.splitlines()[0] == url and "shards" in there.output if fmt == "webdataset" else True
    there, here = run("info", url, "--json"), run("info", str(local), "--json")
    assert json.loads(same_dataset(there.output, local, url)) == json.loads(here.output)


def test_info_json_of_a_shard_folder_url_is_its_packer_json(s3, pairs):
    """What info prints is the record s3fs reads there, and the bytes its listing adds up to."""
    _, url = pairs["webdataset"]
    key = url.removeprefix("s3://")
    printed = json.loads(run("info", url, "--json").output)
    record = json.loads(s3.cat(f"{key}/packer.json"))
    assert {k: v for k, v in printed.items() if k not in ("path", "bytes_on_disk")} == record
    assert printed["path"] == url and printed["bytes_on_disk"] == sum(s3.du(key, total=False).values())
    assert f"{url}/shard-{{000000..000004}}.tar" in run("info", url).output  # the brace pattern over the URL


def test_info_json_of_a_blob_url_is_its_metadata_section(s3, pairs):
    """The blob's metadata section, found from its header as docs/FORMATS.md lays it out
    (little-endian <8sIIQ12Q: magic, version, alignment, count, six (offset, length) pairs; the
    metadata's is the last), read with s3fs and struct alone."""
    _, url = pairs["blob"]
    key = url.removeprefix("s3://")
    magic, _version, _alignment, count, *pairs_ = struct.unpack("<8sIIQ12Q", s3.cat_file(key, start=0, end=120))
    offset, length = pairs_[-2], pairs_[-1]
    record = json.loads(s3.cat_file(key, start=offset, end=offset + length))
    printed = json.loads(run("info", url, "--json").output)
    assert magic == b"PACKBLOB" and record["count"] == count == 18
    assert {k: v for k, v in printed.items() if k not in ("path", "bytes_on_disk")} == record
    assert printed["bytes_on_disk"] == s3.size(key)


def test_info_of_a_blob_reads_its_header_and_metadata_only(s3, pairs, monkeypatch):
    """Ranged reads: the header page and the metadata section, never the samples."""
    import readers.formats.remote_blob as remote_blob

    _, url = pairs["blob"]
    asked: list[tuple[int, int]] = []
    real = remote_blob.read_url_range
    monkeypatch.setattr(remote_blob, "read_url_range", lambda u, offset, length: asked.append((offset, length)) or real(u, offset, length))
    assert run("info", url).exit_code == 0
    assert len(asked) == 2 and sum(length for _, length in asked) < 4096 + 8192


@pytest.mark.parametrize("fmt", ["webdataset", "blob"])
def test_verify_of_a_url_checks_every_sample_as_locally(pairs, fmt):
    local, url = pairs[fmt]
    there, here = run("verify", url), run("verify", str(local))
    assert there.exit_code == here.exit_code == 0, there.output
    summary = lambda text: text.split(" s)")[0].rsplit(", ", 1)[0]  # (the seconds apart)
    assert summary(same_dataset(there.output, local, url)) == summary(here.output)
    assert "18 of 18 samples checked, checksums matched" in there.output


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def sample_member(tar_bytes: bytes, key: str) -> tuple[int, int]:
    """(data offset, size) of the member ``key`` of a tar, by the tarfile module."""
    import io

    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        member = tar.getmember(key)
        return member.offset_data, member.size


def test_a_flipped_byte_in_a_remote_shard_is_the_fault_verify_finds_locally(s3, pairs, tmp_path):
    local, url = pairs["webdataset"]
    url = copy_of(s3, url, tmp_path)
    key = url.removeprefix("s3://")
    shard = s3.cat(f"{key}/shard-000001.tar")
    at, size = sample_member(shard, "0000000005.npy")
    damaged = flip(shard, at + size - 10)  # a pixel of sample 5 (the shard's second), past its .npy header
    s3.pipe(f"{key}/shard-000001.tar", damaged)
    s3.invalidate_cache()
    local_copy = tmp_path / "local"
    import shutil

    shutil.copytree(local, local_copy)
    (local_copy / "shard-000001.tar").write_bytes(damaged)
    there, here = run("verify", url), run("verify", str(local_copy))
    assert there.exit_code == here.exit_code == 1
    assert "fault: sample 5 (shard-000001.tar): checksum mismatch" in there.output
    faults = lambda text: [line for line in text.splitlines() if line.startswith("fault:")]
    assert faults(same_dataset(there.output, local_copy, url)) == faults(here.output)


def test_a_remote_shard_cut_short_is_said_as_locally(s3, pairs, tmp_path):
    local, url = pairs["webdataset"]
    url = copy_of(s3, url, tmp_path)
    key = url.removeprefix("s3://")
    shard = s3.cat(f"{key}/shard-000002.tar")
    s3.pipe(f"{key}/shard-000002.tar", shard[:-2048])
    s3.invalidate_cache()
    result = run("verify", url)
    assert result.exit_code == 1
    assert (f"fault: dataset: {url}/shard-000002.tar: shard has {len(shard) - 2048:,} bytes, "
            f"the metadata says {len(shard):,}: it is truncated") in result.output
    assert run("info", url).exit_code == 1  # as a local info of it: the store does not open


def test_a_flipped_byte_in_a_remote_blob_names_the_sample(s3, pairs, tmp_path):
    _, url = pairs["blob"]
    url = copy_of(s3, url, tmp_path)
    key = url.removeprefix("s3://")
    blob = s3.cat(key)
    data_offset = struct.unpack("<8sIIQ12Q", blob[:120])[4]  # (the data section's offset)
    sample_bytes = 3 * 16 * 16
    s3.pipe(key, flip(blob, data_offset + 7 * sample_bytes + 10))  # sample 7
    s3.invalidate_cache()
    result = run("verify", url)
    assert result.exit_code == 1
    assert [line for line in result.output.splitlines() if line.startswith("fault:")] == [
        "fault: sample 7: checksum mismatch: the stored sample changed after it was written"]


def test_a_remote_blob_cut_short_is_one_dataset_fault(s3, pairs, tmp_path):
    _, url = pairs["blob"]
    url = copy_of(s3, url, tmp_path)
    key = url.removeprefix("s3://")
    blob = s3.cat(key)
    s3.pipe(key, blob[: len(blob) // 2])
    s3.invalidate_cache()
    result = run("verify", url)
    assert result.exit_code == 1 and f"fault: dataset: {url}: truncated: it has {len(blob) // 2:,} bytes" in result.output


def test_verify_of_a_blob_reads_it_by_bounded_ranges(s3, pairs, monkeypatch):
    """Never the whole object at once: the payloads come in reads of at most MAX_READ bytes."""
    import readers.formats.remote_blob as remote_blob

    _, url = pairs["blob"]
    monkeypatch.setattr(remote_blob, "MAX_READ", 4 * 3 * 16 * 16)
    asked: list[int] = []
    real = remote_blob.read_url_range
    monkeypatch.setattr(remote_blob, "read_url_range", lambda u, offset, length: asked.append(length) or real(u, offset, length))
    result = run("verify", url)
    assert result.exit_code == 0, result.output
    size = pairs["blob"][0].stat().st_size
    assert max(asked) <= 4 * 3 * 16 * 16 and len(asked) >= 18 // 4 and sum(asked) < size


def test_an_upload_in_progress_is_refused_in_one_line(s3, pairs, tmp_path):
    """Shards stored and the marker, no metadata record yet: what a conversion writing the URL leaves."""
    _, url = pairs["webdataset"]
    url = copy_of(s3, url, tmp_path)
    key = url.removeprefix("s3://")
    s3.rm(f"{key}/packer.json")
    s3.pipe(f"{key}/packer-uploading.json", b'{"packer_upload": "in progress"}\n')
    s3.invalidate_cache()
    from readers.schema import IncompleteDatasetError
    from readers.webdataset import StreamingShards

    for given in (url, f"{url}/shard-{{000000..000004}}.tar"):  # (StreamingShards reads the same record, the same way)
        with pytest.raises(IncompleteDatasetError, match=f"^{url}: an unfinished upload by packer"):
            StreamingShards(given)
    for command in ("info", "verify"):
        result = run(command, url)
        assert result.exit_code == 1
        assert result.output == (f"Error: {url}: an unfinished upload by packer (it holds packer-uploading.json and no metadata record "
                                 "yet); read it once its conversion finishes, or finish it with packer convert --resume\n")


def test_a_url_without_a_packer_dataset_is_one_line(s3, tmp_path):
    base = f"s3://{BUCKET}/nothing-{tmp_path.name}"
    s3.pipe(f"{base.removeprefix('s3://')}/notes.txt", b"hello")
    s3.invalidate_cache()
    for url, message in ((f"{base}/notes.txt", "not a packer dataset at a URL"), (base, "not a packer dataset at a URL"),
                         (f"{base}/missing", "no such packed dataset")):
        for command in ("info", "verify"):
            result = run(command, url)
            assert result.exit_code == 1 and result.output.startswith(f"Error: {url}: {message}"), (command, url, result.output)
            assert result.output.count("\n") == 1


def test_head_and_preview_of_a_url_say_which_commands_take_one(pairs):
    _, url = pairs["blob"]
    for command in ("head", "preview"):
        result = run(command, url)
        assert result.exit_code == 1
        assert result.output == (f"Error: {url}: a s3:// URL; packer {command} reads datasets from local paths (or file:// URLs): "
                                 "copy the dataset to a local disk first (packer info and packer verify take its URL)\n")


def test_verify_a_url_against_its_source(pairs, image_folder):
    _, url = pairs["webdataset"]
    result = run("verify", url, "--source", str(image_folder), "-j", "1")
    assert result.exit_code == 0, result.output
    assert "18 compared with the source" in result.output


def test_info_and_verify_of_a_static_http_folder(pairs):
    local, _ = pairs["webdataset"]
    with served(local.parent) as root:
        url = f"{root}/{local.name}"
        there, here = run("info", url, "--json"), run("info", str(local), "--json")
        assert there.exit_code == 0, there.output
        assert json.loads(same_dataset(there.output, local, url)) == json.loads(here.output)
        result = run("verify", url)
        assert result.exit_code == 0 and "18 of 18 samples checked, checksums matched" in result.output, result.output


def test_a_server_that_does_not_answer_is_one_line(monkeypatch):
    import socket

    import readers.remote

    monkeypatch.setattr(readers.remote, "RETRY_DELAY", 0.01)
    with socket.socket() as free:
        free.bind((LOOPBACK, 0))
        port = free.getsockname()[1]
    url = f"http://{LOOPBACK}:{port}/shards"
    for command in ("info", "verify"):
        result = run(command, url)
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert result.output.startswith(f"Error: {url}: cannot be read (OSError: {url}/packer.json: cannot be read (") and "refused" in result.output


def test_files_packer_did_not_write_are_said_as_locally(s3, pairs, tmp_path):
    """A user's notes in the folder (a note) and a .tar among the shards (a fault), found by
    the folder's listing; info counts their bytes as the local info does."""
    import shutil

    local, url = pairs["webdataset"]
    url = copy_of(s3, url, tmp_path)
    local_copy = tmp_path / "local"
    shutil.copytree(local, local_copy)
    for name, data in (("notes.txt", b"my notes\n"), ("extra.tar", bytes(1024))):
        s3.pipe(f"{url.removeprefix('s3://')}/{name}", data)
        (local_copy / name).write_bytes(data)
    s3.invalidate_cache()
    there, here = run("verify", url), run("verify", str(local_copy))
    assert there.exit_code == here.exit_code == 1
    said = lambda text: [line for line in text.splitlines() if line.startswith(("fault:", "note:"))]
    assert said(same_dataset(there.output, local_copy, url)) == said(here.output)
    assert "fault: extra.tar: a .tar packer did not write" in there.output and "(notes.txt)" in there.output
    there, here = run("info", url, "--json"), run("info", str(local_copy), "--json")
    assert json.loads(there.output)["bytes_on_disk"] == json.loads(here.output)["bytes_on_disk"]


def test_a_blob_without_its_header_is_said_unfinished_as_locally(s3, pairs, tmp_path):
    """The header page is written last: a .blob object without it is an unfinished conversion
    (a copy cut short, a staged upload stopped), a dataset fault, not 'no packer dataset'."""
    local, url = pairs["blob"]
    url = copy_of(s3, url, tmp_path)
    key = url.removeprefix("s3://")
    blob = s3.cat(key)
    s3.pipe(key, bytes(4096) + blob[4096:])
    s3.invalidate_cache()
    local_copy = tmp_path / "local.blob"
    local_copy.write_bytes(bytes(4096) + blob[4096:])
    there, here = run("verify", url), run("verify", str(local_copy))
    assert there.exit_code == here.exit_code == 1
    assert f"fault: dataset: {url}: no blob header: the conversion did not finish" in there.output
    faults = lambda text: [line for line in text.splitlines() if line.startswith("fault:")]
    assert faults(same_dataset(there.output, local_copy, url)) == faults(here.output)
