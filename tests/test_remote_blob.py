"""A blob written to s3:// by multipart upload while it grows (packer/multipart.py), against a
moto S3 server on 127.0.0.1 (the ``s3`` fixture, conftest.py) that enforces S3's 5 MiB
minimum part size."""

from __future__ import annotations

import json
import os
import signal
import shutil
import struct
from pathlib import Path

import pytest
import torch

from packer import ImageOptions, convert
from packer.errors import OutputExistsError, OutputError
from checkpoints import convert_until_checkpoint, inputs_converted

#: S3's least part size (all parts but the last); the tests use it for part 1 and the others.
PART = 5 << 20
#: A child conversion with those part sizes.
SMALL_PARTS = f"import packer.multipart as m; m.FIRST_PART = m.MIN_PART = {PART}"
IMAGE = ImageOptions(size=224)  # 150,528 bytes a sample: 35 samples a part


@pytest.fixture(scope="module")
def big_source(tmp_path_factory) -> Path:
    """600 tiny JPEGs in 2 classes; at 224x224 raw, a 90 MB blob."""
    from packer.samples import make_image_folder

    return make_image_folder(tmp_path_factory.mktemp("big") / "src", classes=2, per_class=300, size=(12, 16))


@pytest.fixture
def small_parts(monkeypatch):
    import packer.multipart as multipart
    import packer.writers.journal as journal

    monkeypatch.setattr(multipart, "FIRST_PART", PART)
    monkeypatch.setattr(multipart, "MIN_PART", PART)
    monkeypatch.setattr(journal, "CHECKPOINT_BYTES", 2 << 20)  # a checkpoint every 14 samples


def open_uploads(s3, bucket: str = "packer-test") -> list[str]:
    """Keys with a multipart upload in progress (neither completed nor aborted)."""
    return [u["Key"] for u in s3.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])]


def assert_same_blob(fetched: Path, local: Path, *, images: bool = True) -> None:
    """Same header sections and bytes, metadata apart from ``created``; (``images``) samples alike."""
    from readers.open import open_dataset

    a, b = fetched.read_bytes(), local.read_bytes()
    _, version, alignment, count, *pairs = struct.unpack("<8sIIQ12Q", a[:120])
    assert a[:120] == b[:120] and len(a) == len(b)
    meta_offset, meta_end = pairs[-2], pairs[-2] + pairs[-1]
    assert a[:meta_offset] == b[:meta_offset]  # header, data, labels, offsets, shapes, checksums
    assert a[meta_end:] == b[meta_end:]  # the source names (after the metadata)
    meta_a, meta_b = (json.loads(x[meta_offset:meta_end]) for x in (a, b))
    assert {**meta_a, "created": None} == {**meta_b, "created": None}
    if not images:
        return
    da, db = open_dataset(fetched), open_dataset(local)
    assert len(da) == len(db) == count
    for i in (0, count // 2, count - 1):
        assert torch.equal(da[i][0], db[i][0]) and da[i][1] == db[i][1]


def test_blob_streams_to_s3_while_it_is_written(s3, big_source, tmp_path, monkeypatch, small_parts):
    """Parts go up during the conversion, their local bytes are released (local disk stays well
    below the file), the object appears only when complete, and equals a local conversion."""
    import packer.multipart as multipart

    url, key = "s3://packer-test/streamed.blob", "packer-test/streamed.blob"
    sent: list[tuple[int, int, int, bool]] = []  # (part number, local bytes on disk, file size, object visible)
    real_upload = multipart.MultipartUpload._upload

    def spy(self, part):
        stat = os.fstat(self._fd)
        sent.append((part.number, stat.st_blocks * 512, stat.st_size, s3.exists(key)))
        s3.invalidate_cache()
        return real_upload(self, part)

    monkeypatch.setattr(multipart.MultipartUpload, "_upload", spy)
    report = convert(big_source, url, format="blob", image=IMAGE, workers=1)
    assert report.written == 600 and str(report.dst) == url
    numbers = [n for n, *_ in sent]
    assert sorted(numbers) == list(range(1, len(numbers) + 1)) and numbers[-1] == 1  # part 1 (the header) last
    assert len(numbers) >= 10  # 90 MB in parts of about 5 MiB, most sent while converting
    assert not any(visible for *_, visible in sent)  # nothing at the URL until the upload completes
    on_disk, size = max(d for _, d, _, _ in sent), sent[-1][2]
    assert size > 80e6 and on_disk < size / 3  # uploaded bytes were released (punched holes)
    assert open_uploads(s3) == []
    local = convert(big_source, tmp_path / "local.blob", format="blob", image=IMAGE, workers=1)
    s3.get(key, str(tmp_path / "fetched.blob"))
    assert_same_blob(tmp_path / "fetched.blob", Path(local.dst))


def fail_sample_300(monkeypatch) -> None:
    """Make the blob writer fail, as a disk does, at sample 300."""
    from packer.writers.blob import BlobWriter

    real_write = BlobWriter._write

    def failing_write(self, index, sample):
        if index == 300:
            raise OSError(5, "simulated I/O error")
        return real_write(self, index, sample)

    monkeypatch.setattr(BlobWriter, "_write", failing_write)


def test_a_failed_blob_conversion_aborts_its_upload(s3, big_source, monkeypatch, small_parts):
    from packer.remote import staging_folder

    url = "s3://packer-test/failed.blob"
    fail_sample_300(monkeypatch)
    with pytest.raises(OutputError, match="simulated I/O error") as raised:
        convert(big_source, url, format="blob", image=IMAGE, workers=1)
    # said of the DST as given, with where it was staged (it named only the staging path: an S3 walkthrough)
    assert str(raised.value).startswith(f"{url} (staged in {staging_folder(url)}): "), raised.value
    s3.invalidate_cache()
    assert not s3.exists("packer-test/failed.blob") and open_uploads(s3) == []
    assert not staging_folder(url).exists()


def test_a_failed_overwrite_leaves_the_blob_it_would_replace(s3, big_source, tmp_path, monkeypatch, small_parts):
    """--overwrite of an s3:// blob removed the old object before converting, so a run that failed
    (or was interrupted) left nothing (an HF walkthrough), where README says the old one stays
    until the new one is complete: the upload's completion replaces it."""
    from packer.remote import staging_folder

    url = "s3://packer-test/kept.blob"
    shutil.rmtree(staging_folder(url), ignore_errors=True)  # (the staging folder is this machine's, not the test's)
    convert(big_source, url, format="blob", image=ImageOptions(size=8), workers=1)
    before = s3.cat("packer-test/kept.blob")
    from packer.writers.blob import BlobWriter

    real_write = BlobWriter._write
    fail_sample_300(monkeypatch)
    with pytest.raises(OutputError, match="simulated I/O error"):
        convert(big_source, url, format="blob", image=IMAGE, workers=1, overwrite=True)
    s3.invalidate_cache()
    assert s3.cat("packer-test/kept.blob") == before and open_uploads(s3) == []
    monkeypatch.setattr(BlobWriter, "_write", real_write)  # (undo() would drop small_parts' patches too)
    convert(big_source, url, format="blob", image=IMAGE, workers=1, overwrite=True)
    s3.invalidate_cache()
    s3.get("packer-test/kept.blob", str(tmp_path / "new.blob"))
    assert_same_blob(tmp_path / "new.blob", Path(convert(big_source, tmp_path / "local.blob", format="blob", image=IMAGE, workers=1).dst))


def test_a_failed_part_upload_stops_the_conversion(s3, big_source, monkeypatch, small_parts):
    import packer.multipart as multipart

    real_call = multipart.MultipartUpload._call

    def flaky(self, method, **kwargs):
        if method == "upload_part" and kwargs["PartNumber"] == 3:
            raise OutputError(f"{self.url}: upload_part failed (simulated)")
        return real_call(self, method, **kwargs)

    monkeypatch.setattr(multipart.MultipartUpload, "_call", flaky)
    with pytest.raises(OutputError, match="upload_part failed"):
        convert(big_source, "s3://packer-test/flaky.blob", format="blob", image=IMAGE, workers=1)
    s3.invalidate_cache()
    assert not s3.exists("packer-test/flaky.blob") and open_uploads(s3) == []


def stored_parts(state: Path) -> int:
    try:
        return sum(p["etag"] is not None and p["number"] > 1 for p in json.loads(state.read_text())["parts"])
    except (OSError, ValueError):
        return 0


def test_ctrl_c_then_resume_a_blob_to_s3(s3, big_source, tmp_path, monkeypatch, small_parts):
    """A Ctrl-C once parts were stored aborted the upload and deleted its record, so --resume was
    refused ('the interrupted upload's record is missing') and the saved inputs were lost (a
    walkthrough; only SIGKILL was tested): the upload stays open and --resume finishes it."""
    import packer.parallel as parallel
    from packer.multipart import state_path
    from packer.remote import staging_folder

    url = "s3://packer-test/interrupted.blob"
    shutil.rmtree(staging_folder(url), ignore_errors=True)  # (the staging folder is this machine's, not the test's)
    partial = staging_folder(url) / "interrupted.blob.partial"
    journal = partial.with_name(partial.name + "-journal") / "journal.json"
    args = ["convert", str(big_source), url, "-j", "1", "-q", "--size", "224", "-f", "blob"]
    saved = convert_until_checkpoint(args, journal, setup=SMALL_PARTS, until=lambda: stored_parts(state_path(partial)) >= 2,
                                     sig=signal.SIGINT)
    assert 0 < saved < 600 and state_path(partial).exists()
    s3.invalidate_cache()
    assert open_uploads(s3) == ["interrupted.blob"] and not s3.exists("packer-test/interrupted.blob")
    with inputs_converted(monkeypatch, parallel) as sizes:
        report = convert(big_source, url, format="blob", image=IMAGE, workers=1, resume=True)
    assert report.written == 600 and sizes == [600 - report.resumed] and report.resumed >= saved
    assert open_uploads(s3) == [] and not staging_folder(url).exists()
    local = convert(big_source, tmp_path / "local.blob", format="blob", image=IMAGE, workers=1)
    s3.get("packer-test/interrupted.blob", str(tmp_path / "fetched.blob"))
    assert_same_blob(tmp_path / "fetched.blob", Path(local.dst))


def test_sigkill_then_resume_a_blob_to_s3(s3, big_source, tmp_path, monkeypatch, small_parts):
    """Killed after parts were stored and released locally: the object does not exist; --resume
    keeps the stored parts, converts only the inputs after the checkpoint, and the result equals
    a local conversion. A later fresh run aborts an interrupted upload instead of leaking it."""
    import packer.parallel as parallel
    from packer.multipart import state_path
    from packer.remote import staging_folder

    url = "s3://packer-test/resumed.blob"
    partial = staging_folder(url) / "resumed.blob.partial"
    journal = partial.with_name(partial.name + "-journal") / "journal.json"
    args = ["convert", str(big_source), url, "-j", "1", "-q", "--size", "224", "-f", "blob"]
    committed = convert_until_checkpoint(args, journal, setup=SMALL_PARTS, until=lambda: stored_parts(state_path(partial)) >= 2)
    assert 0 < committed < 600
    s3.invalidate_cache()
    assert not s3.exists("packer-test/resumed.blob") and open_uploads(s3) == ["resumed.blob"]
    assert os.stat(partial).st_blocks * 512 < os.stat(partial).st_size  # stored parts' bytes are gone locally

    with inputs_converted(monkeypatch, parallel) as sizes:
        report = convert(big_source, url, format="blob", image=IMAGE, workers=1, resume=True)
    assert report.written == 600 and sizes == [600 - committed]
    assert open_uploads(s3) == [] and not staging_folder(url).exists()
    local = convert(big_source, tmp_path / "local.blob", format="blob", image=IMAGE, workers=1)
    s3.get("packer-test/resumed.blob", str(tmp_path / "fetched.blob"))
    assert_same_blob(tmp_path / "fetched.blob", Path(local.dst))

    # killed again: a plain re-run refuses to discard the checkpoint; started over with
    # --overwrite, the interrupted upload is aborted
    url = "s3://packer-test/restarted.blob"
    partial = staging_folder(url) / "restarted.blob.partial"
    journal = partial.with_name(partial.name + "-journal") / "journal.json"
    args[2] = url
    saved = convert_until_checkpoint(args, journal, setup=SMALL_PARTS, until=lambda: stored_parts(state_path(partial)) >= 1)
    assert open_uploads(s3) == ["restarted.blob"]
    with pytest.raises(OutputExistsError, match=f"saved {saved:,} inputs; run the same command with --resume"):
        convert(big_source, url, format="blob", image=IMAGE, workers=1)
    assert open_uploads(s3) == ["restarted.blob"] and journal.exists()
    convert(big_source, url, format="blob", image=IMAGE, workers=1, overwrite=True)
    assert open_uploads(s3) == []
    s3.get("packer-test/restarted.blob", str(tmp_path / "restarted.blob"))
    assert_same_blob(tmp_path / "restarted.blob", Path(local.dst))


def test_a_text_corpus_to_s3(s3, tmp_path, monkeypatch, small_parts):
    """Tokenised text to an s3:// blob: parts go up as its checkpoints make them durable, as for images."""
    import packer.multipart as multipart
    from packer.options import TextOptions

    calls = []
    send, finish = multipart.MultipartUpload._send, multipart.MultipartUpload.finish
    monkeypatch.setattr(multipart.MultipartUpload, "_send", lambda self, start, end, *, last: calls.append("part") or send(self, start, end, last=last))
    monkeypatch.setattr(multipart.MultipartUpload, "finish", lambda self: calls.append("finish") or finish(self))

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(40):  # 12 MB of byte tokens (uint16): part 1 and the rest
        (corpus / f"doc{i:02d}.txt").write_text(f"document {i} " * 12_000, encoding="utf-8")
    options = dict(format="blob", text=TextOptions(), workers=1)
    report = convert(corpus, "s3://packer-test/tokens.blob", **options)
    assert calls.index("finish") > 0 and calls[0] == "part"  # a part sent while converting, before the end
    local = convert(corpus, tmp_path / "tokens.blob", **options)
    assert report.written == local.written == 40
    s3.get("packer-test/tokens.blob", str(tmp_path / "fetched.blob"))
    assert (tmp_path / "fetched.blob").stat().st_size > 2 * PART
    assert_same_blob(tmp_path / "fetched.blob", Path(local.dst), images=False)
    assert open_uploads(s3) == []


#: A child conversion that dies (SIGKILL) in finish, once the last parts are stored, before part 1.
DIE_IN_FINISH = SMALL_PARTS + """
import os, signal
real_upload = m.MultipartUpload._upload
def upload(self, part):
    if part.number == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_upload(self, part)
m.MultipartUpload._upload = upload
"""


def test_killed_while_finishing_then_resumed(s3, big_source, tmp_path, small_parts):
    """Killed after the final parts (past the last checkpoint) were stored: --resume cuts the
    file back to its checkpoint and sends them again. Without the upload's record, --resume
    refuses (released bytes cannot be sent again) instead of uploading zeros."""
    import subprocess
    import sys

    from checkpoints import CHILD
    from packer.multipart import state_path
    from packer.remote import staging_folder

    url = "s3://packer-test/finishing.blob"
    partial = staging_folder(url) / "finishing.blob.partial"
    args = ["convert", str(big_source), url, "-j", "1", "-q", "--size", "224", "-f", "blob"]
    child = subprocess.run([sys.executable, "-c", f"{DIE_IN_FINISH}\n{CHILD}", *args], capture_output=True, timeout=120)
    assert child.returncode == -9, child.stderr.decode()
    state = json.loads(state_path(partial).read_text())
    assert any(p["final"] and p["etag"] for p in state["parts"])  # killed with final parts stored
    assert open_uploads(s3) == ["finishing.blob"] and not s3.exists("packer-test/finishing.blob")

    state_path(partial).rename(tmp_path / "state.json")
    with pytest.raises(OutputError, match="record .* is missing; run without --resume"):
        convert(big_source, url, format="blob", image=IMAGE, workers=1, resume=True)
    (tmp_path / "state.json").rename(state_path(partial))  # the refusal kept the partial output

    report = convert(big_source, url, format="blob", image=IMAGE, workers=1, resume=True)
    assert report.written == 600 and open_uploads(s3) == []
    local = convert(big_source, tmp_path / "local.blob", format="blob", image=IMAGE, workers=1)
    s3.get("packer-test/finishing.blob", str(tmp_path / "fetched.blob"))
    assert_same_blob(tmp_path / "fetched.blob", Path(local.dst))


def test_no_space_for_the_upload_record_is_one_error(s3, big_source, monkeypatch, small_parts):
    import errno

    import packer.multipart as multipart

    real_save = multipart.MultipartUpload._save_state
    calls = []

    def full_disk(self):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(self)

    monkeypatch.setattr(multipart.MultipartUpload, "_save_state", full_disk)
    with pytest.raises(OutputError, match="no space left on the device"):
        convert(big_source, "s3://packer-test/full.blob", format="blob", image=IMAGE, workers=1)
    assert open_uploads(s3) == []


def test_part_sizes_stay_within_s3_limits():
    """Parts grow with the file: a 1 TiB blob (far beyond one reader's RAM) takes fewer than half
    of S3's 10,000 parts, and S3's largest object (5 TiB) fits; no part is above the largest."""
    from packer.multipart import FIRST_PART, MAX_PART, MAX_PARTS, MIN_PART, MultipartUpload

    def parts_for(total: int) -> int:
        offset, parts = FIRST_PART, 1
        while offset < total:
            size = MultipartUpload._part_size(offset)
            assert MIN_PART <= size <= MAX_PART
            offset, parts = offset + size, parts + 1
        return parts

    assert parts_for(1 << 40) < MAX_PARTS // 2 and parts_for(5 << 40) <= MAX_PARTS


def test_punch_hole_releases_blocks_and_keeps_the_size(tmp_path):
    from packer.files import punch_hole

    path = tmp_path / "file"
    path.write_bytes(os.urandom(4 << 20))
    fd = os.open(path, os.O_RDWR)
    try:
        if not punch_hole(fd, 1 << 20, 2 << 20):
            pytest.skip("this filesystem cannot punch holes")
        stat = os.fstat(fd)
        assert stat.st_size == 4 << 20 and stat.st_blocks * 512 <= 2 << 20
        assert os.pread(fd, 2 << 20, 1 << 20) == bytes(2 << 20)
    finally:
        os.close(fd)
