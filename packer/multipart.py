"""Stream a growing local file to one S3 object by multipart upload (a blob's ``s3://`` DST).

A blob's header page, at offset 0, is written last (packer/writers/blob.py), so the file
cannot be uploaded front to back while it is written. S3 multipart parts, though, may be sent
in any order, and the object appears only at ``CompleteMultipartUpload``, whole (as atomic as
the local rename). So:

* part 1 is the first :data:`FIRST_PART` bytes (the header page and the first payloads). It
  stays on local disk and is sent at the end, with the finished header in it;
* parts 2, 3, ... are the bytes after it, sent by background threads as the writer's
  checkpoints make them durable (packer/writers/journal.py). Once a part is stored its local
  bytes are released: a hole is punched in ``DST.partial``, which keeps its size and offsets,
  so the writer and its resume journal work unchanged. The writer checkpoints at least every
  :attr:`MultipartUpload.sync_bytes` (32 MiB) for this; local disk holds part 1, the parts
  being sent (:data:`UPLOAD_THREADS`, past that the conversion waits) and what was written
  since they were planned: about 100 MB for a blob of any size up to 16 GB (parts then grow
  with the file, see :meth:`MultipartUpload._part_size`: about 0.6% of it at 100 GB);
* at the end the tail (the last payloads, the small sections and the metadata) goes up as the
  last part(s), then part 1, then the upload is completed.

The upload id and every part (planned, then stored with its ETag) are recorded in a JSON file
beside ``DST.partial`` (:func:`state_path`), synced before a part's local bytes are released.
``--resume`` carries on the same upload: parts recorded as stored are checked against S3
(``ListParts``) and kept, planned ones are sent again from local disk. The parts :meth:`finish`
sends lie past the last checkpoint and keep their local bytes (``Part.final``): a run killed
while finishing resumes from its checkpoint and sends them again. A fresh run aborts the
upload an interrupted one left; a failed run aborts its own. S3 keeps an upload nobody
completes or aborts (a killed run never resumed, its staging folder lost) until a bucket
lifecycle rule removes it. Text corpora checkpoint as images do, so their blobs stream the same way.

On a filesystem without hole punching (not Linux, or a filesystem without
``FALLOC_FL_PUNCH_HOLE``), the upload still streams but local disk holds the whole file.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import OutputError
from .files import punch_hole

__all__ = ["MultipartUpload", "supports_multipart", "state_path", "FIRST_PART", "MIN_PART", "MAX_PART"]

#: Bytes of part 1 (header page plus the first payloads), kept locally and sent last.
#: S3 wants every part but the last to be at least 5 MiB.
FIRST_PART = 8 << 20
#: Durable bytes that are worth a part of their own (parts also grow with the file, so that
#: S3's 10,000-part limit is never reached: see :meth:`MultipartUpload._part_size`).
MIN_PART = 16 << 20
#: The largest part sent (S3 allows 5 GiB; a part is read into memory to be sent).
MAX_PART = 1 << 30
#: S3's limit on the part numbers of one upload.
MAX_PARTS = 10_000
#: Parts sent at once; past that the conversion waits (back-pressure).
UPLOAD_THREADS = 2
_STATE_VERSION = 1

log = logging.getLogger("packer")


def supports_multipart(fs: Any) -> bool:
    """Whether ``fs`` is an S3 filesystem (s3fs), whose multipart API this module drives."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return any(p in ("s3", "s3a") for p in protocols) and hasattr(fs, "call_s3")


def state_path(local: Path) -> Path:
    """The upload's state file, beside the local file ``local``."""
    return local.with_name(local.name + "-upload.json")


@dataclass
class Part:
    """Bytes ``[start, end)`` of the file, sent as part ``number``; ``etag`` once stored.
    ``final``: sent by :meth:`MultipartUpload.finish`, past the last checkpoint (a resumed run
    cuts the file back before it, so its local bytes are kept, and it is sent again)."""

    number: int
    start: int
    end: int
    etag: str | None = None
    final: bool = False


class MultipartUpload:
    """The blob writer's sink (:class:`~packer.writers.blob.BlobSink`) for an ``s3://`` DST:
    the file the writer fills goes to ``url`` as one object, part by part while it grows."""

    def __init__(self, fs: Any, path: str, url: str, *, threads: int = UPLOAD_THREADS) -> None:
        self.fs, self.url = fs, url
        self.bucket, self.key, _ = fs.split_path(path)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="packer-part")
        self._threads = threads
        self._pending: list[concurrent.futures.Future] = []
        self._lock = threading.Lock()  # guards the part list and the state file
        self._parts: list[Part] = []
        self._upload_id: str | None = None
        self._fd = -1
        self._punches = True

    # -- BlobSink ---------------------------------------------------------------------------
    def start(self, local: Path, *, resumed_end: int | None = None) -> None:
        """Begin uploading the file ``local`` (just created), or, with ``resumed_end``, carry on
        the upload of an interrupted run whose file was cut back to ``resumed_end`` bytes."""
        self._state = state_path(local)
        self._fd = os.open(local, os.O_RDWR)
        previous = self._load_state()
        if resumed_end is not None and previous is not None:
            self._resume(previous, resumed_end)
            return
        if resumed_end is not None and _first_hole(self._fd, FIRST_PART) < resumed_end:
            # bytes were released after their upload, and the record of that upload is gone
            raise OutputError(f"{self.url}: the interrupted upload's record ({self._state.name}) is missing; run without --resume to start over")
        if previous is not None:  # an interrupted run's upload, not resumed: S3 would keep it
            self._abort_upload(previous["upload_id"])
        reply = self._call("create_multipart_upload", Bucket=self.bucket, Key=self.key)
        self._upload_id, self._parts = str(reply["UploadId"]), []
        self._save_state()

    def synced(self, end: int) -> None:
        """The file's first ``end`` bytes are durable (a checkpoint is committed): send them as
        parts once there are enough. Waits while :data:`UPLOAD_THREADS` parts are being sent."""
        self._reap(block=len(self._pending) >= self._threads)
        planned = self._planned_end()
        if end - planned >= self._part_size(planned):
            self._send(planned, end, last=False)

    def finish(self) -> None:
        """The file is complete: send the rest, then part 1 (with the header), then complete
        the upload, which makes the object appear whole."""
        self._reap(block=True, every=True)
        size = os.fstat(self._fd).st_size
        if size > FIRST_PART:
            self._send(self._planned_end(), size, last=True)
            self._reap(block=True, every=True)
        self._upload(Part(1, 0, min(size, FIRST_PART)))
        with self._lock:
            parts = sorted(self._parts, key=lambda p: p.number)
        self._call(
            "complete_multipart_upload", Bucket=self.bucket, Key=self.key, UploadId=self._upload_id,
            MultipartUpload={"Parts": [{"PartNumber": p.number, "ETag": p.etag} for p in parts]},
        )
        self._upload_id = None  # completed: nothing for abort() to abort
        self.fs.invalidate_cache(f"{self.bucket}/{self.key}")
        self._state.unlink(missing_ok=True)
        self.close()

    def abort(self) -> None:
        """The conversion failed: stop, and abort the upload (S3 drops its parts)."""
        for future in self._pending:
            future.cancel()
        self.close()
        if self._upload_id is not None:
            self._abort_upload(self._upload_id)
            self._upload_id = None
        state = getattr(self, "_state", None)
        if state is not None:
            state.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop the upload threads and close the file (the upload itself is left as it is)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def sync_bytes(self) -> int:
        """A checkpoint (and so a part) at least every 2 parts' worth of bytes: bounds local disk."""
        return 2 * MIN_PART

    # -- parts ------------------------------------------------------------------------------
    def _planned_end(self) -> int:
        with self._lock:
            return max((p.end for p in self._parts if p.number > 1), default=FIRST_PART)

    @staticmethod
    def _part_size(offset: int) -> int:
        """The least bytes worth a part at ``offset``: at least 1/500 of what precedes it,
        so the part count stays far below S3's 10,000 (sizes grow geometrically)."""
        return min(max(MIN_PART, offset // 500), MAX_PART)

    def _send(self, start: int, end: int, *, last: bool) -> None:
        """Plan ``[start, end)`` as parts of at most :data:`MAX_PART` (recorded before they are
        sent) and send them in the background."""
        new = []
        with self._lock:
            number = max((p.number for p in self._parts), default=1)
            while start < end:
                stop = min(end, start + MAX_PART)
                if not last and end - stop < MIN_PART:  # no small part in the middle
                    stop = end
                number += 1
                if number > MAX_PARTS:
                    raise OutputError(f"{self.url}: more than {MAX_PARTS:,} upload parts; convert locally and copy the file")
                new.append(Part(number, start, stop, final=last))
                start = stop
            self._parts.extend(new)
            self._save_state()
        self._pending += [self._pool.submit(self._upload, part) for part in new]

    def _upload(self, part: Part) -> None:
        """Send one part, record its ETag (synced), then release its local bytes."""
        data = _pread(self._fd, part.end - part.start, part.start)
        reply = self._call("upload_part", Bucket=self.bucket, Key=self.key, UploadId=self._upload_id, PartNumber=part.number, Body=data)
        with self._lock:
            if part.number == 1:
                self._parts = [p for p in self._parts if p.number != 1]
                self._parts.append(part)
            part.etag = str(reply["ETag"])
            self._save_state()
        if part.number > 1 and not part.final and self._punches:
            if not punch_hole(self._fd, part.start, part.end - part.start):
                self._punches = False
                log.warning("%s: this filesystem cannot release uploaded bytes; the local copy grows to the whole file", self.url)

    def _reap(self, *, block: bool, every: bool = False) -> None:
        """Forget finished sends (raising what failed); with ``block``, wait for one first (all
        with ``every``)."""
        if block and self._pending:
            when = concurrent.futures.ALL_COMPLETED if every else concurrent.futures.FIRST_COMPLETED
            concurrent.futures.wait(self._pending, return_when=when)
        done = [f for f in self._pending if f.done()]
        self._pending = [f for f in self._pending if not f.done()]
        for future in done:
            error = future.exception()
            if error is not None:
                if isinstance(error, (OutputError, OSError)):  # OSError: local (S3 errors are OutputError), e.g. a full disk
                    raise error
                raise OutputError(f"{self.url}: upload failed ({error})")

    # -- resume -----------------------------------------------------------------------------
    def _resume(self, previous: dict[str, Any], resumed_end: int) -> None:
        """Take up ``previous``'s upload: keep its stored parts (checked with ListParts), send
        its planned ones again. Local bytes of stored parts are gone, so anything amiss stops."""
        self._upload_id = str(previous["upload_id"])
        # part 1 and the final parts of a killed finish are sent again (their numbers re-used)
        parts = [Part(**p) for p in previous["parts"] if p["number"] > 1 and not p.get("final")]
        stored = self._stored_parts()
        lost = [p for p in parts if p.etag is not None and stored.get(p.number) != p.etag]
        if lost or any(p.end > resumed_end for p in parts):
            raise OutputError(
                f"{self.url}: the interrupted upload's parts are gone or ahead of its checkpoint; run without --resume to start over"
            )
        self._parts = parts
        self._save_state()
        for part in parts:
            if part.etag is not None and self._punches:  # stored, but maybe killed before its release
                self._punches = punch_hole(self._fd, part.start, part.end - part.start)
        self._pending += [self._pool.submit(self._upload, p) for p in parts if p.etag is None]

    def _stored_parts(self) -> dict[int, str]:
        """Part number -> ETag of what S3 holds for this upload (an unknown upload: an error)."""
        stored: dict[int, str] = {}
        marker = 0
        while True:
            reply = self._call("list_parts", Bucket=self.bucket, Key=self.key, UploadId=self._upload_id, PartNumberMarker=marker)
            stored.update({int(p["PartNumber"]): str(p["ETag"]) for p in reply.get("Parts", [])})
            if not reply.get("IsTruncated"):
                return stored
            marker = int(reply["NextPartNumberMarker"])

    # -- state and S3 -----------------------------------------------------------------------
    def _load_state(self) -> dict[str, Any] | None:
        try:
            state = json.loads(self._state.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION or state.get("url") != self.url:
            return None
        return state

    def _save_state(self) -> None:
        """Atomically replace the state file, synced (the caller holds the lock)."""
        record = {"version": _STATE_VERSION, "url": self.url, "upload_id": self._upload_id, "parts": [asdict(p) for p in self._parts]}
        tmp = self._state.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self._state)
        folder = os.open(self._state.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself is durable before any bytes are released
        finally:
            os.close(folder)

    def _abort_upload(self, upload_id: str) -> None:
        try:
            self._call("abort_multipart_upload", Bucket=self.bucket, Key=self.key, UploadId=upload_id)
        except OutputError as exc:
            log.warning("%s: could not abort the unfinished upload %s (%s); a bucket lifecycle rule removes it", self.url, upload_id, exc)

    def _call(self, method: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return self.fs.call_s3(method, **kwargs)
        except Exception as exc:  # noqa: BLE001 - botocore and s3fs errors alike: one line naming the URL
            raise OutputError(f"{self.url}: {method} failed ({exc})") from None


def _first_hole(fd: int, offset: int) -> int:
    """Where the file's first hole at or after ``offset`` starts (its end counts as one)."""
    try:
        return os.lseek(fd, offset, os.SEEK_HOLE)
    except AttributeError:  # no SEEK_HOLE: not Linux, where punch_hole makes no holes either
        return os.fstat(fd).st_size
    except OSError:  # ENXIO: offset is past the end
        return offset


def _pread(fd: int, length: int, offset: int) -> bytes:
    """Exactly ``length`` bytes at ``offset`` (one ``pread`` returns at most about 2 GiB)."""
    chunks = []
    while length > 0:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            raise OutputError(f"the local file ended {length} bytes early")
        chunks.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b"".join(chunks)
