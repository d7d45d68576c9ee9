"""A SRC at an fsspec URL (``s3://``, ``gs://``, ``http(s)://``, ``file://``...): streamed, never copied whole.

The folder is listed once, in the process that scans it (:class:`FsspecTree`: one recursive
``find``, a paginated object listing on S3), and :func:`packer.sources.images.scan_image_folder`
applies the same rules as to a local folder. Items carry their object's URL; the worker that
converts an item reads its bytes with :func:`read_url_bytes`, through one filesystem object
per process (made on first use, so it works alike in the forkserver pool's workers and in Ray
tasks). Credentials and endpoints come from the usual places, the environment and config
files, read by each worker process: the local pool's workers have the environment this
process had at its first conversion (they fork from packer/parallel.py's fork server, started
then). A transient read error is retried, then the input fails like an unreadable local file:
skipped and recorded, or the conversion stops naming its URL. A worker reads
:data:`READ_AHEAD` objects ahead of the one it converts (:func:`read_ahead`, threads), so the
object store's latency overlaps decoding instead of adding to it.

Needs fsspec and the backend of the URL's scheme: ``pip install 'packer[remote]'`` (s3fs for
s3://; gcsfs for gs://; aiohttp for http(s)://).
"""

from __future__ import annotations

import collections
import concurrent.futures
import importlib.util
import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator, TypeVar
from urllib.parse import quote, unquote

from readers.remote import STALL_SECONDS, is_url
from readers.schema import Skipped

from ..errors import OptionError, SourceError
from .rules import image_order, is_hidden, is_image_name, unread_images

__all__ = ["is_source_url", "url_filesystem", "FsspecTree", "read_url_bytes", "read_ahead", "remote_chunksize", "RemoteReadError", "READ_ATTEMPTS", "READ_AHEAD", "store_answers", "PROBE_SECONDS"]

T = TypeVar("T")
R = TypeVar("R")

#: Reads of one object before it counts as unreadable (transient errors only; see :func:`read_url_bytes`).
READ_ATTEMPTS = 3
#: Seconds before the first retry; doubled for each further one.
RETRY_DELAY = 0.25
#: Objects a worker keeps being read (by threads) ahead of the one it converts: an object store
#: answers in tens of ms and a decode takes a few, so one read at a time leaves the core idle.
READ_AHEAD = 16
#: Seconds a store has to answer :func:`store_answers`.
PROBE_SECONDS = 20.0
#: Most inputs of a URL SRC sent to a pool worker at once (:func:`remote_chunksize`).
REMOTE_CHUNK = 64
#: Errors that are the object's, not the network's: never retried.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
#: Listing keys that change when an object is rewritten (the first one present is used).
_VERSION_KEYS = ("ETag", "etag", "md5Hash", "generation", "mtime", "LastModified", "last_modified", "updated")


class RemoteReadError(OSError):
    """An object could not be read; the message is the reason recorded for the skipped input.
    ``unreachable``: the store itself did not answer, every try (not this object's fault: the
    conversion stops, as the next reads would fail too)."""

    unreachable = False


def is_source_url(value: str) -> bool:
    """Whether SRC ``value`` is read through fsspec: a URL with a scheme, ``file://`` included."""
    return is_url(value) or str(value).startswith("file://")


def url_filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem for ``url`` and the path in it; :class:`OptionError` naming the
    package to install when fsspec or the scheme's backend is missing."""
    try:
        import fsspec
    except ImportError:
        from readers.extras import install_hint

        raise OptionError(f"{url}: remote SRC/DST needs fsspec (and s3fs for s3://): {install_hint('remote')}") from None
    options = {}
    if url[:8].lower().startswith(("http://", "https://")) and importlib.util.find_spec("aiohttp") is not None:
        import aiohttp  # its default: 300 s for a whole read, none for a stall: a stalled server held a worker's chunk for long

        options["client_kwargs"] = {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=STALL_SECONDS)}
    try:
        return fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as exc:
        from readers.extras import install_hint

        raise OptionError(f"{url}: {exc} ({install_hint('remote')})") from None


class FsspecTree:
    """The :class:`~packer.sources.images.FolderTree` of a folder URL, from one recursive listing."""

    def __init__(self, url: str) -> None:
        self.fs, path = url_filesystem(url)
        self.path_in_fs = path.rstrip("/") or path
        self._base = path.rstrip("/")  # item paths are ``_base/relative``
        self.root = self.fs.unstrip_protocol(self.path_in_fs)  # the URL, normalised: metadata's ``source``
        self.name = url
        self._listing: dict[tuple[str, ...], dict[str, Any]] | None = None
        self._files_below: dict[str, list[tuple[str, ...]]] | None = None
        #: Folders cut from the listing as loops (:func:`_without_loops`), recorded as a local
        #: tree records the symlinks it does not follow (packer/sources/images.py).
        self.refused: list[Skipped] = []

    def kind(self) -> str | None:
        try:
            self.fs.invalidate_cache(self.path_in_fs)  # list afresh, not what this process saw before
            if self.fs.isdir(self.path_in_fs):
                return "dir"
            return "file" if self.fs.exists(self.path_in_fs) else None
        except FileNotFoundError:  # a missing bucket
            return None
        except Exception as exc:  # noqa: BLE001 - any backend's network or credential error, said in one line
            raise SourceError(f"{self.name}: {self.cannot_list(exc)}") from None

    def _entries(self) -> dict[tuple[str, ...], dict[str, Any]]:
        """Relative path parts -> listing detail, for every file and folder below the root."""
        if self._listing is None:
            follows = _follows_links(self.fs)
            try:
                if follows:
                    found = _walk_without_loops(self.fs, self.path_in_fs)
                else:
                    found = self.fs.find(self.path_in_fs, withdirs=True, detail=True)
            except Exception as exc:  # noqa: BLE001 - any backend's network or credential error, said in one line
                raise SourceError(f"{self.name}: {self.cannot_list(exc)}") from None
            prefix = self._base + "/"
            listing: dict[tuple[str, ...], dict[str, Any]] = {}
            for name, detail in found.items():
                name = self.fs._strip_protocol(name).rstrip("/")
                if name.startswith(prefix):
                    parts = name[len(prefix) :].split("/")  # over HTTP percent-encoded (%20, %C3%A9): names as the server's files are
                    listing[tuple(unquote(p, errors="surrogateescape") for p in parts) if follows else tuple(parts)] = detail
            if follows:  # (an object store has no links: identical folders there are two folders)
                listing, loops = _without_loops(listing)
                self.refused = [Skipped("/".join(loop), LOOP_REASON) for loop in loops]
            self._listing = listing
        return self._listing

    def broken_links(self, entries: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return []  # (an object store's listing has no symlinks)

    def top(self) -> list[tuple[str, str]]:
        kinds: dict[str, str] = {}
        for parts, detail in self._entries().items():
            if len(parts) > 1 or detail.get("type") == "directory":
                kinds[parts[0]] = "dir"  # object stores have folders only as key prefixes
            else:
                kinds.setdefault(parts[0], "file")
        return sorted(kinds.items())

    def images(self, folder: str, skipped: list[Skipped]) -> list[str]:
        if self._files_below is None:  # once: the files below each top-level folder
            self._files_below = {}
            for parts, detail in self._entries().items():
                if len(parts) > 1 and detail.get("type") != "directory":
                    self._files_below.setdefault(parts[0], []).append(parts[1:])
        inside = [
            parts for parts in self._files_below.get(folder, ())
            if is_image_name(parts[-1]) and not any(is_hidden(p) for p in parts[:-1])
        ]
        inside.sort(key=image_order)
        # (in the local walk's order: a folder's own files, then its sub-folders')
        for parts in sorted((p for p in self._files_below.get(folder, ()) if not any(is_hidden(q) for q in p[:-1])),
                            key=lambda p: (p[:-1], p[-1])):
            skipped.extend(unread_images("/".join((folder, *parts[:-1])), parts[-1:]))
        return [self.path("/".join((folder, *parts))) for parts in inside]

    def path(self, name: str) -> str:
        """The URL of ``name`` (relative, as the listing's names are: over HTTP, encoded again)."""
        return self.fs.unstrip_protocol(f"{self._base}/{quote(name, errors='surrogateescape') if _follows_links(self.fs) else name}")

    def cannot_list(self, exc: Exception) -> str:
        return f"cannot list the folder ({type(exc).__name__}: {_first_line(exc)}); check the URL and the credentials"

    def is_output(self, folder: str) -> bool:
        return False  # (a packer dataset at a URL is a WebDataset upload's shards: not images, an empty class)

    def stamps(self) -> dict[str, str]:
        stamps = {}
        for parts, detail in self._entries().items():
            if detail.get("type") == "directory":
                continue
            version = next((detail[k] for k in _VERSION_KEYS if detail.get(k) is not None), "")
            stamps[self.path("/".join(parts))] = f"{detail.get('size')}:{version}"
        return stamps


#: Why a folder of a URL's listing is not followed.
LOOP_REASON = ("lists exactly what a folder above it lists (a link back up, as the server follows it: over HTTP a "
               "symlink loop looks like endless folders); not followed")


def _without_loops(listing: dict[tuple[str, ...], dict[str, Any]]) -> tuple[dict[tuple[str, ...], dict[str, Any]], list[tuple[str, ...]]]:
    """``listing`` less every folder whose entries (names, kinds, sizes) are exactly those of a
    folder above it, and what is below it; and those folders (for listings that follow links:
    :func:`_follows_links`). A server that follows symlinks
    (``python -m http.server``) shows ``cat/loop -> ..`` as ``cat/loop/cat/loop/...``, every
    class's images again under ``cat``, as deep as its URLs go."""
    children: dict[tuple[str, ...], set] = {}
    for parts, detail in listing.items():
        children.setdefault(parts[:-1], set()).add((parts[-1], detail.get("type"), detail.get("size")))
    signature = {folder: frozenset(entries) for folder, entries in children.items()}
    loops: list[tuple[str, ...]] = []
    for folder in sorted(signature, key=len):
        if not folder or any(folder[: len(loop)] == loop for loop in loops):
            continue
        if any(signature.get(folder[:k]) == signature[folder] for k in range(len(folder))):
            loops.append(folder)
    if not loops:
        return listing, []
    kept = {parts: detail for parts, detail in listing.items() if not any(parts[: len(loop)] == loop for loop in loops)}
    return kept, loops


def _follows_links(fs: Any) -> bool:
    """Whether ``fs`` lists folders through symlinks (HTTP, as the server serves them): there a
    symlink loop is an endless tree of folders. (fsspec's ``file://`` lists a link without
    entering it; an object store has none.)"""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return bool({"http", "https"} & set(protocols))


def _walk_without_loops(fs: Any, root: str) -> dict[str, dict[str, Any]]:
    """``fs.find(root, withdirs=True, detail=True)``, a folder at a time, never descending into a
    folder that lists exactly what a folder above it lists (:func:`_without_loops` then records
    it): fsspec's own walk of such a server went on for minutes, as deep as its URLs went."""
    found: dict[str, dict[str, Any]] = {}
    pending = [(root.rstrip("/"), ())]
    while pending:
        folder, above = pending.pop()
        entries = fs.ls(folder, detail=True)
        signature = frozenset((str(e["name"]).rstrip("/").rsplit("/", 1)[-1], e.get("type"), e.get("size")) for e in entries)
        for entry in entries:
            found[str(entry["name"]).rstrip("/")] = entry
        if signature in above:
            continue  # a loop: its entries are kept, for _without_loops to find and cut
        for entry in entries:
            if entry.get("type") == "directory":
                pending.append((str(entry["name"]).rstrip("/"), (*above, signature)))
    found.pop(root.rstrip("/"), None)
    return found


# -- worker side ----------------------------------------------------------------------------
_filesystems: dict[str, Any] = {}
_filesystems_pid = 0


def _filesystem_for(url: str) -> tuple[Any, str]:
    """This process's filesystem object for ``url``'s scheme (made once per process), and the path."""
    global _filesystems_pid
    if _filesystems_pid != os.getpid():  # a fresh worker, or a fork: never share a parent's connections
        _filesystems.clear()
        _filesystems_pid = os.getpid()
    scheme = url.split("://", 1)[0]
    fs = _filesystems.get(scheme)
    if fs is None:
        fs, path = url_filesystem(url)
        _filesystems[scheme] = fs
        return fs, path
    return fs, fs._strip_protocol(url)


def _transient() -> tuple[type[BaseException], ...]:
    """Errors worth another try: the network's (connections, timeouts), not the object's."""
    import asyncio  # (its TimeoutError is not the builtin one before Python 3.11)

    errors: tuple[type[BaseException], ...] = (OSError, asyncio.TimeoutError)
    aiohttp = sys.modules.get("aiohttp")  # http(s) and s3 backends raise its errors, when it is in use
    if aiohttp is not None:
        errors += (aiohttp.ClientError,)
    botocore = sys.modules.get("botocore.exceptions")  # s3fs's: an endpoint that cannot be reached is not an OSError
    if botocore is not None:
        errors += (botocore.ConnectionError, botocore.HTTPClientError)
    return errors


def store_answers(url: str, seconds: float | None = None) -> bool:
    """Whether the store holding ``url`` answers a request about it within ``seconds`` (default
    :data:`PROBE_SECONDS`): an answer that the object is missing or forbidden is an answer too.
    Asked when an input of a URL SRC timed out, to tell a stalled store from an input that hangs
    its decoder. http(s) is asked with a HEAD request of its own (fsspec's ``info`` turns a
    connection that fails into "not found")."""
    import threading

    seconds = PROBE_SECONDS if seconds is None else seconds
    answered: list[bool] = []

    def ask() -> None:
        if url[:8].lower().startswith(("http://", "https://")):
            import urllib.error
            import urllib.request

            from readers.remote import http_request

            try:
                urllib.request.urlopen(http_request(url, "HEAD"), timeout=seconds).close()  # noqa: S310 - the user's SRC
            except urllib.error.HTTPError:
                pass  # (any status is an answer)
            except (urllib.error.URLError, OSError):  # (refused, reset, timed out: no answer)
                answered.append(False)
                return
            except Exception:  # noqa: BLE001 - a malformed answer is an answer
                pass
            answered.append(True)
            return
        try:
            fs, path = _filesystem_for(url)
            fs.info(path)
        except _unanswered():
            answered.append(False)
            return
        except Exception:  # noqa: BLE001 - any other error is the store's answer
            pass
        answered.append(True)

    asking = threading.Thread(target=ask, name="packer-store-probe", daemon=True)  # (a stalled request is left behind)
    asking.start()
    asking.join(seconds)
    return bool(answered and answered[0])


def _unanswered() -> tuple[type[BaseException], ...]:
    """Errors that say the store did not answer at all (a connection refused or lost, a timeout)."""
    import asyncio

    errors: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, asyncio.TimeoutError)
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None:
        errors += (aiohttp.ClientConnectionError,)
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is not None:
        errors += (botocore.ConnectionError, botocore.HTTPClientError)
    return errors


def read_url_bytes(url: str, *, attempts: int = READ_ATTEMPTS) -> bytes:
    """The bytes of the object at ``url``, read through this process's filesystem object.

    A transient error (a connection reset, a timeout) is retried, ``attempts`` reads in all,
    waiting :data:`RETRY_DELAY` seconds, then twice as long; a missing or forbidden object is
    not. Raises :class:`RemoteReadError` whose message is the reason to record.
    """
    fs, path = _filesystem_for(url)
    transient = _transient()
    # s3fs asks for the size first (a HEAD request) to split large objects over parallel
    # ranged reads; an image is one GET.
    options = {"max_concurrency": 1} if getattr(fs, "max_concurrency", 1) > 1 else {}
    for attempt in range(1, attempts + 1):
        try:
            return fs.cat_file(path, **options)
        except _PERMANENT as exc:
            raise RemoteReadError(f"cannot read ({type(exc).__name__}: {_first_line(exc)})") from None
        except transient as exc:
            if attempt == attempts:
                error = RemoteReadError(f"cannot read after {attempts} attempts ({type(exc).__name__}: {_first_line(exc)})")
                error.unreachable = isinstance(exc, _unanswered())  # (another OSError may be this object's own: skipped)
                raise error from None
            time.sleep(RETRY_DELAY * 2 ** (attempt - 1))
        except Exception as exc:  # noqa: BLE001 - a backend's own error type: recorded with the input, as decode errors are
            raise RemoteReadError(f"cannot read ({type(exc).__name__}: {_first_line(exc)})") from None
    raise AssertionError("unreachable")  # pragma: no cover


def remote_chunksize(items: int, workers: int | None) -> int | None:
    """Inputs a pool worker gets at once from a URL SRC of ``items`` inputs (``None`` without a
    worker count: the executor's own choice). Up to :data:`REMOTE_CHUNK`: a worker reads a
    chunk ahead while converting it, and each chunk starts with one round trip of waiting."""
    if workers is None:
        return None
    return max(1, min(REMOTE_CHUNK, items // (workers * 4)))


def read_ahead(read: Callable[[T], R], items: Iterable[T], window: int = READ_AHEAD) -> Iterator[R]:
    """``read(item)`` for each item, in order, with up to ``window`` of them running at once in
    this process's reader threads (their latency overlaps the caller's work on earlier ones).
    ``read`` must not raise: it returns its failure as a value."""
    pool = _reader_pool(window)
    items = iter(items)
    pending: collections.deque[concurrent.futures.Future[R]] = collections.deque()
    try:
        for item in items:
            pending.append(pool.submit(read, item))
            if len(pending) >= window:
                break
        while pending:
            done = pending.popleft()
            for item in items:  # one more in flight for each one taken
                pending.append(pool.submit(read, item))
                break
            yield done.result()
    finally:  # abandoned early (the caller failed): reads not yet started are dropped
        for future in pending:
            future.cancel()


_readers: tuple[int, int, concurrent.futures.ThreadPoolExecutor] | None = None


def _reader_pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """This process's reader threads (made on first use; a forked child makes its own)."""
    global _readers
    if _readers is None or _readers[0] != os.getpid() or _readers[1] < threads:
        if _readers is not None and _readers[0] == os.getpid():
            _readers[2].shutdown(wait=False)  # a smaller pool: its threads end when idle
        _readers = (os.getpid(), threads, concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="packer-read"))
    return _readers[2]


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
