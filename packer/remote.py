"""Remote SRC and DST through fsspec URLs (``pip install 'packer[remote]'``; s3:// needs s3fs).

* DST, WebDataset: streamed, never staged whole. The writer runs in a local staging folder
  (:func:`staging_folder`) with an :class:`Uploader` as its sink: each shard, once published
  (finished, renumbered, named), is uploaded by background threads and then deleted locally;
  at most :data:`MAX_PENDING` published shards wait for upload, past that the conversion waits
  (back-pressure), so local disk holds only the shards being written or waiting. At the end
  the index and checksum files go up, and the metadata record last, once everything else is
  stored: a reader that finds the metadata finds every shard it lists. Until then the folder
  also holds an in-progress marker object (readers/formats/uploading.py), stored first, which
  readers given the shards by a brace pattern refuse. ``--overwrite`` of a finished dataset
  stores the new one at ``URL.partial`` and copies it over once whole (server-side), so a run
  that fails or is interrupted leaves the old one as it was. With ``--executor ray``
  the tasks return their shards' bytes to the driver instead of writing files (they may run on
  nodes that do not see the staging folder). A failed conversion removes what it uploaded.
  ``--resume`` works: a checkpoint lists only shards already uploaded, the journal stays in the
  staging folder (the same path for the same user and URL), and the resumed run keeps those
  shards and deletes any uploaded after the checkpoint.
* DST, blob: to ``s3://`` streamed by S3 multipart upload (packer/multipart.py: the first 8 MiB,
  with the header written last, go up last; the rest as checkpoints make it durable, its local
  blocks then released; the object appears whole when the upload completes); to any other URL
  staged whole and uploaded when finished (a blob fits one reader's RAM, so one machine's disk
  holds it too). ``--resume`` works for both.
* SRC: streamed, never copied whole. The image folder at the URL is listed once (a local
  folder's rules) and each worker reads its inputs' bytes through fsspec (packer/sources/remote.py);
  ``--resume`` works (the fingerprint comes from the listing). Skipped inputs are recorded by their
  path relative to SRC, and the metadata's ``source`` is the URL.

An existing remote DST is refused unless ``overwrite`` (or, for an unfinished WebDataset upload
without its metadata, ``resume``; an interrupted ``--overwrite``'s ``URL.partial`` too).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol, Sequence

from readers.formats import PARTIAL_SUFFIX
from readers.remote import is_url

from .destination import nothing_to_resume
from .errors import OutputError, PackerError
from .locking import DestinationLock, lock_path
from .sources.remote import url_filesystem

__all__ = ["is_url", "is_dst_url", "dst_filesystem", "remote_destination", "RemoteDestination", "Staging", "upload", "staging_folder", "Uploader", "MAX_PENDING"]

#: Published files that may wait for (or be in) upload before the conversion waits for them.
MAX_PENDING = 4
#: Files uploaded at once.
UPLOAD_THREADS = 2

log = logging.getLogger("packer")


def dst_filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of a DST URL and the path in it (one helper for SRC and DST; tests
    replace this name)."""
    return url_filesystem(url)


def is_dst_url(value: str) -> bool:
    """Whether DST ``value`` is written through fsspec: a URL with a scheme, ``file://`` included."""
    return is_url(value) or str(value).startswith("file://")


def _is_local(fs: Any) -> bool:
    """Whether ``fs`` is fsspec's local filesystem (``file://``)."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocols


def staging_folder(url: str) -> Path:
    """The local folder a conversion to ``url`` runs in before upload: the same path for the same
    user and URL, so that ``--resume`` finds the journal of a killed run."""
    user = str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "")
    digest = hashlib.sha256(f"{user}\0{url.rstrip('/')}".encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"packer-upload-{digest}"


class Uploader:
    """The WebDataset writer's sink for a URL DST (:class:`~packer.writers.webdataset.ShardSink`).

    :meth:`put` queues a finished local file; ``threads`` background threads upload each under
    its name below ``url``, then delete the local copy. At most ``max_pending`` files wait or
    upload at once: past that :meth:`put` blocks, so a conversion faster than the network waits
    instead of filling the local disk. ``marker``: ``(name, bytes)`` stored first, neither listed
    by :meth:`stored` nor removed until :meth:`publish` (the format's ``publish`` removes it; what
    it returns is :meth:`clean_up`'s). Call :meth:`close` when done (or :meth:`discard`)."""

    def __init__(self, url: str, *, max_pending: int = MAX_PENDING, threads: int = UPLOAD_THREADS,
                 marker: tuple[str, bytes] | None = None, publish: Callable[[Any, str], Callable[[], None] | None] | None = None) -> None:
        if max_pending < 1 or threads < 1:
            raise ValueError(f"max_pending and threads must be positive, got {max_pending}, {threads}")
        self.url = url.rstrip("/")
        self.fs, root = dst_filesystem(self.url)
        self.root = root.rstrip("/")
        self.max_pending = max_pending
        self._marker = marker[0] if marker else None
        self._on_publish, self._clean_up = publish, None
        #: Whether :meth:`publish` began: what is stored is then whole, and never discarded.
        self.publishing = False
        self._local = _is_local(self.fs)  # a local folder must exist before files go in (object stores: no folders)
        self._queue: collections.deque[Path] = collections.deque()
        self._busy = 0
        self._error: BaseException | None = None
        self._closed = self._stopped = False
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._run, name=f"packer-upload-{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()
        if marker is not None:
            self._store_marker(marker[1])

    def _store_marker(self, content: bytes) -> None:
        try:
            if self._local:
                self.fs.makedirs(self.root, exist_ok=True)
            self.fs.pipe_file(f"{self.root}/{self._marker}", content)
        except BaseException as exc:
            self.close()
            if not isinstance(exc, OSError):
                raise
            raise OutputError(f"{self.url}: cannot store there ({exc})") from None

    # -- ShardSink --------------------------------------------------------------------------
    def put(self, path: Path) -> None:
        """Queue ``path`` for upload (it is deleted once uploaded); wait while ``max_pending`` are pending."""
        with self._cond:
            while len(self._queue) + self._busy >= self.max_pending and self._error is None and not self._closed:
                self._cond.wait()
            self._check()
            self._queue.append(Path(path))
            self._cond.notify_all()

    def flush(self) -> None:
        """Wait until every queued file is uploaded; raise :class:`OutputError` if one failed (or :meth:`stop` came)."""
        with self._cond:
            while (self._queue or self._busy) and self._error is None and not self._stopped:
                self._cond.wait()
            self._check()

    def stored(self) -> dict[str, int]:
        """Names and sizes of the files below the URL (an interrupted run's uploads included)."""
        try:
            self.fs.invalidate_cache(self.root)
            if not self.fs.exists(self.root):
                return {}
            entries = self.fs.ls(self.root, detail=True)
        except OSError as exc:
            raise OutputError(f"{self.url}: cannot list ({exc})") from None
        named = {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: int(e["size"]) for e in entries if e.get("type") == "file"}
        named.pop(self._marker, None)  # (not the writer's: it stays while the upload runs)
        return named

    def remove(self, names: Sequence[str]) -> None:
        """Delete the files ``names`` below the URL."""
        if names:
            try:
                self.fs.rm([f"{self.root}/{name}" for name in names])
            except OSError as exc:
                raise OutputError(f"{self.url}: cannot delete {names[0]} ({exc})") from None

    def discard(self) -> None:
        """Stop (queued files are dropped, uploads in progress finish) and delete the URL's folder:
        a failed conversion leaves nothing behind (what did reach it has no metadata, so no
        reader accepts it even if this fails)."""
        self.close()
        if self.publishing:  # (whole: the writer keeps its checkpoint, and --resume publishes it again)
            return
        try:
            if self.fs.exists(self.root):
                self.fs.rm(self.root, recursive=True)
        except OSError as exc:
            log.warning("%s: could not remove the partial upload (%s); no reader accepts it (no metadata)", self.url, exc)

    def publish(self) -> None:
        """Everything is stored, the metadata record last: make it the destination (``publish``,
        given by the format: the marker goes, or a staged copy replaces the dataset it stands for)."""
        self.flush()
        self.publishing = True
        try:
            if self._on_publish is not None:
                self._clean_up = self._on_publish(self.fs, self.root)
        except OSError as exc:
            raise OutputError(f"{self.url}: publishing the upload failed ({exc}); it is whole there: --resume publishes it again") from None

    def clean_up(self) -> None:
        """What :meth:`publish` left for once the journal is gone (a staged copy's removal)."""
        if self._clean_up is not None:
            self._clean_up()

    # -- lifetime ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop now (an interrupted run): queued files are dropped and a :meth:`flush` waiting fails;
        uploads in progress are left to their threads, never waited for (a slow store kept a Ctrl-C
        waiting minutes). No checkpoint lists their files: a resumed run deletes what they store."""
        with self._cond:
            self._closed = self._stopped = True
            self._queue.clear()
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the upload threads (after :meth:`flush`, nothing is left; else queued files are
        dropped, and uploads in progress finish, unless :meth:`stop` came first)."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        for thread in self._threads if not self._stopped else ():
            thread.join()

    def _check(self) -> None:
        if self._error is not None:
            raise OutputError(f"{self.url}: upload failed ({self._error}); the metadata was not written, so readers refuse the partial copy")
        if self._closed:
            raise OutputError(f"{self.url}: the uploader is closed")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed and self._error is None:
                    self._cond.wait()
                if self._closed or self._error is not None:
                    return
                path = self._queue.popleft()
                self._busy += 1
            error = None
            try:
                if self._local:
                    self.fs.makedirs(self.root, exist_ok=True)
                self.fs.put_file(str(path), f"{self.root}/{path.name}")
                path.unlink()
            except BaseException as exc:  # noqa: BLE001 - raised in the converting thread by put/flush
                error = exc
            with self._cond:
                self._busy -= 1
                if error is not None and self._error is None:
                    self._error = error
                self._cond.notify_all()


def upload(local: Path, url: str) -> None:
    """Copy the finished single-file output ``local`` (a blob) to ``url``, then delete it locally.

    A failed upload is removed again (a partial file would be refused as truncated anyway)."""
    fs, root = dst_filesystem(url)
    root = root.rstrip("/")
    try:
        if _is_local(fs):
            fs.makedirs(fs._parent(root), exist_ok=True)
        fs.put_file(str(local), root)
    except OSError as exc:
        try:
            if fs.exists(root):
                fs.rm(root)
        except OSError:
            pass
        raise OutputError(f"{url}: upload failed ({exc})") from None
    local.unlink()


class RemoteDestination(Protocol):
    """What a format that can be written to a URL tells the staging here (its writer's
    ``remote``: packer/writers/webdataset/destination.py, packer/writers/blob.py)."""

    @staticmethod
    def sink(url: str, final: str) -> Any:
        """The writer's sink storing at ``url`` the output that ends at ``final`` (the same URL,
        or ``final`` + ``.partial`` where :meth:`replaced_whole` is false and a dataset is
        replaced); ``None``: the finished file is uploaded whole."""
        ...

    @staticmethod
    def unfinished(fs: Any, root: str) -> bool:
        """Whether what is at ``root`` is an unfinished upload (``--resume`` may carry it on)."""
        ...

    @staticmethod
    def is_ours(fs: Any, root: str, *, staged: bool) -> bool:
        """Whether what is at ``root`` is packer's (``--overwrite`` may replace it); ``staged``:
        this machine's staging folder for it exists."""
        ...

    @staticmethod
    def held_elsewhere(fs: Any, root: str) -> str | None:
        """Why what is at ``root`` must be left as it is: an upload another machine is storing
        there, or stopped storing (the clause to say); ``None``: nothing says so."""
        ...

    @staticmethod
    def is_staged(fs: Any, root: str) -> bool:
        """Whether what is at ``root`` (``URL.partial``) is the new dataset an ``--overwrite``
        stores there (``--resume`` carries it on, ``--overwrite`` removes it); asked only where
        not :meth:`replaced_whole`. Anything else there, a finished dataset of that name
        included, is left alone."""
        ...

    @staticmethod
    def nothing_to_lose(fs: Any, root: str, url: str, dst: str) -> bool:
        """Whether what is at ``root`` may be written over as it is (an empty folder); raises
        :class:`~packer.errors.OutputExistsError` where even ``--overwrite`` must leave it."""
        ...

    @staticmethod
    def foreign_content(fs: Any, root: str) -> list[str]:
        """What packer's dataset at ``root`` holds that its conversion did not write (``--overwrite`` refuses it)."""
        ...

    @staticmethod
    def replaced_whole() -> bool:
        """Whether the finished output replaces what is at ``root`` in one step (a blob object),
        so ``--overwrite`` leaves the old one until then; else ``--overwrite`` of a finished
        dataset stores the new one beside it, at ``URL.partial``, and its sink's publishing
        copies it over."""
        ...


def _store_url(url: str, dst: str, remote: RemoteDestination, *, overwrite: bool, resume: bool) -> str:
    """Where the conversion to ``url`` stores its output: ``url``, or ``url.partial`` (an
    ``--overwrite`` of a finished dataset, or the ``--resume`` of one interrupted); refuses what
    :func:`_check_remote_dst` refuses, and a ``url.partial`` left by an interrupted
    ``--overwrite`` unless ``resume`` (carried on) or ``overwrite`` (removed first). Anything
    else at ``url.partial`` (a finished dataset a user named so) is left alone, and refused only
    where the new dataset would be stored there."""
    beside = url + PARTIAL_SUFFIX
    in_the_way = False  # someone else's (a finished dataset of that name too): left, refused where needed
    if not remote.replaced_whole():
        for place in (url, beside):  # (this machine's lock cannot see another machine's conversion)
            fs, root = dst_filesystem(place)
            there = _exists(fs, root.rstrip("/"), dst)
            held = remote.held_elsewhere(fs, root.rstrip("/")) if there else None
            if held is not None:
                raise OutputError(f"{dst}: {place} {held}")
        if there:  # (the last place looked at: URL.partial)
            in_the_way = not remote.is_staged(fs, root.rstrip("/"))
            if not in_the_way:
                if resume:
                    return beside
                if not overwrite:
                    raise OutputError(f"{dst}: an interrupted --overwrite left its new dataset unfinished in {beside}; "
                                      "--resume carries it on, --overwrite starts over")
                fs.rm(root.rstrip("/"), recursive=True)
    stored_beside = _check_remote_dst(url, dst, remote, overwrite=overwrite, resume=resume)
    if stored_beside and in_the_way:  # (_check_remote_dst removed nothing: a finished dataset is replaced)
        raise OutputError(f"{dst}: {beside} is there and is not packer's upload of a new dataset; an --overwrite at a URL "
                          "stores the new dataset there before replacing the old one: move it, or choose another DST")
    return beside if stored_beside else url


def _exists(fs: Any, root: str, dst: str) -> bool:
    """``fs.exists(root)``, a backend's own error (credentials: PermissionError; a bad URL) in one line."""
    try:
        return bool(fs.exists(root))
    except Exception as exc:  # noqa: BLE001 - (said in one line)
        raise _cannot_look(dst, exc) from None


def _cannot_look(dst: str, exc: Exception) -> OutputError:  # (a backend's own error looking at dst, in one line)
    return OutputError(f"{dst}: cannot look there ({type(exc).__name__}: {(str(exc).splitlines() or [repr(exc)])[0]}); "
                       "check the URL and the credentials")


def _check_remote_dst(url: str, dst: str, remote: RemoteDestination, *, overwrite: bool, resume: bool) -> bool:
    """Refuse an existing DST at ``url`` unless ``overwrite`` and it is packer's, or ``resume``
    of an unfinished upload (its writer keeps what its journal lists). Whether the new output is
    to be stored beside it: a finished dataset replaced by one not :meth:`~RemoteDestination.replaced_whole`
    (an unfinished upload replaced is removed first: no reader takes it)."""
    fs, root = dst_filesystem(url)
    root = root.rstrip("/")
    try:
        if not _exists(fs, root, dst) or remote.nothing_to_lose(fs, root, url, dst):
            return False
    except PackerError:  # (an OutputExistsError of its own)
        raise
    except Exception as exc:  # noqa: BLE001 - a backend's own errors (credentials: PermissionError; a bad URL): one line
        raise _cannot_look(dst, exc) from None
    unfinished = remote.unfinished(fs, root)
    if resume and unfinished:
        return False
    if not overwrite:
        if resume and remote.is_ours(fs, root, staged=False):
            raise OutputError(nothing_to_resume(dst))
        hint = " (an unfinished upload: --resume carries it on)" if unfinished else ""
        raise OutputError(f"{dst}: already exists{hint}; pass --overwrite to replace it")
    if not remote.is_ours(fs, root, staged=staging_folder(url).exists()):
        raise OutputError(f"{dst}: is not a packer dataset; --overwrite replaces only a packer dataset: remove it yourself or choose another DST")
    foreign = remote.foreign_content(fs, root)
    if foreign:  # as a local DST: replacing the dataset would delete them with it
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3:,} more" if len(foreign) > 3 else "")
        raise OutputError(f"{dst}: a packer dataset that also holds files packer did not write ({shown}); --overwrite would "
                          "delete them with it: move them out, or choose another DST")
    if remote.replaced_whole():
        return False
    if unfinished:
        fs.rm(root, recursive=True)
    return not unfinished


@dataclasses.dataclass(frozen=True)
class Staging:
    """Where the conversion to a URL runs: ``local_dst`` in the staging folder, and the writer's
    ``sink`` (``None``: the finished file is uploaded whole)."""

    local_dst: Path
    sink: Any


@contextmanager
def remote_destination(dst: str, remote: RemoteDestination, *, overwrite: bool, resume: bool) -> Iterator[Staging]:
    """The staging of a conversion to the URL ``dst``, for a format that can be written there
    (``remote``: its writer's): checks and locks the DST, yields where to convert and the sink,
    and after the body uploads a file left whole and removes the staging folder (kept when a
    journal stays in it for ``--resume``)."""
    if "%" in str(dst).rstrip("/").rsplit("/", 1)[-1]:
        # a shard name pattern (s3://b/train/train-%06d.tar): the folder URL holds the output
        folder_url, pattern = str(dst).rstrip("/").rsplit("/", 1)
        local_pattern = f"{folder_url.rsplit('/', 1)[-1]}/{pattern}"
    else:
        folder_url, local_pattern = str(dst).rstrip("/"), ""
    staging = staging_folder(folder_url)
    # before the DST is checked or removed: another conversion on this machine may be uploading it
    with DestinationLock(lock_path(staging), str(dst)):
        store_url = _store_url(folder_url, str(dst), remote, overwrite=overwrite, resume=resume)
        staging.mkdir(mode=0o700, parents=True, exist_ok=True)
        local_dst = staging / (local_pattern or folder_url.rsplit("/", 1)[-1])
        sink = remote.sink(store_url, folder_url)
        try:
            yield Staging(local_dst, sink)
            if sink is None:
                upload(local_dst, folder_url)
        except BaseException:
            try:  # empty unless a journal stays for --resume (a refused resume keeps it, as locally)
                staging.rmdir()
            except OSError:
                pass
            raise
        finally:
            if sink is not None:
                sink.close()
    shutil.rmtree(staging, ignore_errors=True)
