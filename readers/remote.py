"""Remote shards: URLs opened for streaming, the metadata beside them, and a bounded local cache.

:class:`~readers.webdataset.StreamingShards` reads shards from local paths, ``pipe:`` commands
through the webdataset library's ``gopen``, ``http(s)://`` URLs through urllib (a stalled
server is an error after :data:`STALL_SECONDS`, never a hang), and from
any other fsspec URL (``s3://``, ``gs://``, ``memory://``...) through ``fsspec.open`` (``pip
install 'packer[remote]'``; s3 needs s3fs). The metadata record is fetched from the folder URL
the shards share, so ``len()``, resume and per-shard counts work remotely too.

:class:`ShardCache` keeps whole downloaded shards in a local folder up to a byte bound, least
recently used first out: a shard read again in a later epoch (or by another DataLoader worker
on the same machine) is read from local disk. Downloads go to a temporary name and are renamed
when complete, so a reader never sees half a shard.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import os
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlparse

from .quantities import byte_count

__all__ = ["is_url", "open_shard", "open_http", "http_request", "read_url", "url_size", "url_listing", "read_url_range", "ShardCache",
           "GOPEN_SCHEMES", "STALL_SECONDS"]

#: Schemes the webdataset library's ``gopen`` opens itself (the rest go to fsspec).
GOPEN_SCHEMES = frozenset({"", "file", "pipe", "http", "https"})


def is_url(value: str) -> bool:
    """Whether ``value`` is a URL with a scheme (not a local path, a Windows drive or ``pipe:``)."""
    scheme = urlparse(str(value)).scheme
    return len(scheme) > 1 and scheme not in ("file", "pipe")


def _fsspec() -> object:
    try:
        import fsspec
    except ImportError:
        from .extras import install_hint

        raise ImportError(f"reading fsspec URLs needs fsspec (and s3fs for s3://): {install_hint('remote')}") from None
    return fsspec


#: Seconds an http(s) shard may send nothing before its read is an error (a stalled server
#: hung the epoch for good through ``curl``, which had a connect timeout only).
STALL_SECONDS = 60.0
#: Tries to open an http(s) URL (a refused connection, HTTP 5xx): :data:`RETRY_DELAY` seconds,
#: then twice as long each time, apart (7 s in all). A server that accepts the connection and then
#: sends nothing for :data:`STALL_SECONDS` is not tried again: four waits were four minutes.
HTTP_TRIES = 4
RETRY_DELAY = 1.0


def open_shard(url: str) -> BinaryIO:
    """A binary stream of the shard at ``url``: http(s) through urllib (:func:`open_http`),
    ``gopen`` for paths and pipes, else fsspec."""
    if urlparse(url).scheme in ("http", "https"):
        return open_http(url)
    if urlparse(url).scheme in GOPEN_SCHEMES or not is_url(url):
        from webdataset.gopen import gopen

        return gopen(url, "rb")
    return _fsspec().open(url, "rb").open()  # type: ignore[attr-defined]


class _HTTPBody(io.RawIOBase):
    """An http(s) response's body; a read that waits :data:`STALL_SECONDS` for bytes, or a body
    that ends before its Content-Length, is an ``OSError`` naming the URL."""

    def __init__(self, url: str, response: Any) -> None:
        super().__init__()
        self.url, self._response = url, response

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            n = self._response.readinto(buffer)
        except TimeoutError:
            raise OSError(f"{self.url}: nothing arrived for {STALL_SECONDS:g} s: the server stalled") from None
        except http.client.IncompleteRead:  # (a chunked body cut short)
            raise OSError(f"{self.url}: the server ended the transfer early") from None
        short = self._response.length  # (bytes of the Content-Length still to come; urllib returns 0 at a closed connection)
        if n == 0 and len(buffer) and short:
            raise OSError(f"{self.url}: the server ended the transfer early ({short:,} bytes short)")
        return n

    def close(self) -> None:
        self._response.close()
        super().close()


def http_request(url: str, method: str = "GET") -> Any:
    """A ``urllib.request.Request`` for ``url``, ``user:password@`` in it sent as basic
    authentication (urllib takes it for the host's name and refuses the URL)."""
    import base64
    import urllib.request

    parts = urlparse(url)
    if parts.username is None:
        return urllib.request.Request(url, method=method)
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    request = urllib.request.Request(parts._replace(netloc=netloc).geturl(), method=method)
    token = base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    return request


def open_http(url: str) -> BinaryIO:
    """The body of ``url``, opened with up to :data:`HTTP_TRIES` tries, :data:`RETRY_DELAY` s
    apart, then twice as long each time (a 4xx answer is not tried again; a 404 is a
    ``FileNotFoundError``; nothing for :data:`STALL_SECONDS` is an ``OSError`` at once);
    ``user:password@`` in the URL is sent as basic authentication."""
    return io.BufferedReader(_HTTPBody(url, _http_response(url, http_request(url))), 1 << 20)  # type: ignore[return-value]


def _http_response(url: str, request: Any) -> Any:
    """urllib's response to ``request`` (of ``url``), tried as :func:`open_http` says."""
    import urllib.error
    import urllib.request

    for attempt in range(HTTP_TRIES):
        last = attempt == HTTP_TRIES - 1
        try:
            return urllib.request.urlopen(request, timeout=STALL_SECONDS)  # noqa: S310 - a URL the user gave
        except urllib.error.HTTPError as exc:
            error = FileNotFoundError if exc.code == 404 else OSError
            if exc.code < 500 or last:
                raise error(f"{url}: the server answered HTTP {exc.code} ({exc.reason})") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:  # refused, no such host, timed out
            if isinstance(exc, TimeoutError):  # (connected, and no answer: a connect that timed out is a URLError, tried again)
                raise OSError(f"{url}: nothing arrived for {STALL_SECONDS:g} s: the server stalled") from None
            if last:
                raise OSError(f"{url}: cannot be read ({getattr(exc, 'reason', exc)}), after {HTTP_TRIES} tries") from None
        time.sleep(RETRY_DELAY * 2 ** attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def read_url(url: str) -> bytes | None:
    """The bytes at ``url``, or ``None`` if there is nothing there (a missing metadata file)."""
    if urlparse(url).scheme in ("http", "https"):
        try:
            with open_http(url) as body:
                return body.read()
        except FileNotFoundError:
            return None
    fs, path = _fsspec().core.url_to_fs(url)  # type: ignore[attr-defined]
    try:
        with fs.open(path, "rb") as handle:
            return handle.read()
    except (FileNotFoundError, IsADirectoryError):
        return None


def url_size(url: str) -> int | None:
    """Bytes of the object at ``url`` (http(s): a HEAD request's Content-Length); ``None`` when
    there is none (a folder of an object store has no size: ``None`` too)."""
    if urlparse(url).scheme in ("http", "https"):
        try:
            response = _http_response(url, http_request(url, "HEAD"))
        except FileNotFoundError:
            return None
        with response:
            length = response.headers.get("Content-Length")
        return int(length) if length is not None and length.isdigit() else None
    fs, path = _fsspec().core.url_to_fs(url)  # type: ignore[attr-defined]
    fs.invalidate_cache(path)  # (s3fs keeps listings: an object replaced since would keep its old size)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return None
    return int(info["size"]) if info.get("type") == "file" else None


def url_listing(folder_url: str) -> dict[str, int] | None:
    """Name -> bytes of each object right under the folder ``folder_url`` ({} when there is none);
    ``None`` where folders are not listed (http(s): a server's index page is no listing)."""
    if urlparse(folder_url).scheme in ("http", "https"):
        return None
    fs, path = _fsspec().core.url_to_fs(folder_url.rstrip("/"))  # type: ignore[attr-defined]
    fs.invalidate_cache(path)
    try:
        entries = fs.ls(path, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    return {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: int(e["size"]) for e in entries if e.get("type") == "file"}


def read_url_range(url: str, offset: int, length: int) -> bytes:
    """Bytes ``offset:offset + length`` of the object at ``url`` (fewer past its end), by one
    ranged read: an fsspec ``cat_file`` range, an http(s) ``Range`` request (a server that
    ignores it is refused in one line unless ``offset`` is 0: only the bytes asked for are read)."""
    if length <= 0:
        return b""
    if urlparse(url).scheme not in ("http", "https"):
        fs, path = _fsspec().core.url_to_fs(url)  # type: ignore[attr-defined]
        return bytes(fs.cat_file(path, start=offset, end=offset + length))
    request = http_request(url)
    request.add_header("Range", f"bytes={offset}-{offset + length - 1}")
    with io.BufferedReader(_HTTPBody(url, response := _http_response(url, request)), 1 << 20) as body:
        if response.status != 206 and offset:
            raise OSError(f"{url}: the server does not answer range requests (HTTP {response.status} to one); "
                          "a blob is read by ranges: copy it to a local disk, or serve it with a server that does")
        return body.read(length)


#: Seconds after which an untouched partial download in a cache is a killed reader's leftover.
DEAD_DOWNLOAD = 10 * STALL_SECONDS


class ShardCache:
    """Whole shards downloaded into ``folder``, at most ``max_bytes`` of them (LRU by file mtime;
    a shard larger than ``max_bytes`` alone is kept until the next one arrives).

    Shared safely by the processes of one machine: downloads are renamed into place complete,
    and evicting a file another process is reading does not disturb that read (POSIX).
    """

    def __init__(self, folder: str | Path, max_bytes: int, version: str = "") -> None:
        """``version``: what tells this dataset from another at the same URLs (its metadata
        record): a dataset replaced at its URL was read from the cache as it was (3-channel
        samples under 1-channel metadata; an S3 walkthrough)."""
        whole = isinstance(max_bytes, float) and max_bytes.is_integer()  # (5e9 too)
        count = int(max_bytes) if whole else byte_count(max_bytes)  # (or "10GB", as --shard-bytes takes)
        if count is None or count < 1:
            raise ValueError(f"cache_bytes must be a positive number of bytes (or text such as '10GB'), got {max_bytes!r}")
        self.folder = Path(folder)
        self.max_bytes = count
        self.version = version

    def path(self, url: str) -> Path:
        """Where ``url`` is cached: a digest of the URL (and the dataset's version) and its file name."""
        digest = hashlib.sha1(f"{self.version}\n{url}".encode() if self.version else url.encode()).hexdigest()[:16]
        return self.folder / f"{digest}-{url.rstrip('/').rsplit('/', 1)[-1]}"

    def open(self, url: str, size: int | None = None) -> BinaryIO:
        """The shard at ``url``, from the cache, downloading it first when missing; ``size``: its
        size as the metadata records it (a download of another size is refused, never cached;
        a cached file of another size, cut short before this check, is downloaded again)."""
        target = self.path(url)
        if target.exists() and (size is None or target.stat().st_size == size):
            os.utime(target)  # most recently used
            return open(target, "rb")
        self.folder.mkdir(parents=True, exist_ok=True)
        self._clear_dead_downloads()
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".download-")
        try:
            with os.fdopen(fd, "wb") as out, open_shard(url) as stream:
                while chunk := stream.read(1 << 20):
                    out.write(chunk)
            got = os.path.getsize(tmp)
            if size is not None and got != size:
                raise OSError(f"{url}: {got:,} bytes arrived, the metadata says {size:,}: the transfer (or the shard) was cut short; "
                              "nothing was cached")
            self._evict(got)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return open(target, "rb")

    def _clear_dead_downloads(self) -> None:
        """Remove downloads a killed reader left (``.download-*`` untouched for :data:`DEAD_DOWNLOAD`
        seconds: a live one grows, or its read fails, within :data:`STALL_SECONDS`)."""
        now = time.time()
        for entry in os.scandir(self.folder):
            try:
                if entry.name.startswith(".download-") and now - entry.stat().st_mtime > DEAD_DOWNLOAD:
                    os.unlink(entry.path)
            except FileNotFoundError:  # another process cleared it first
                pass

    def _evict(self, incoming: int) -> None:
        """Delete least recently used shards until ``incoming`` more bytes fit the bound."""
        files = []
        for entry in os.scandir(self.folder):
            if entry.is_file() and not entry.name.startswith(".download-"):
                stat = entry.stat()
                files.append((stat.st_mtime, stat.st_size, entry.path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total + incoming <= self.max_bytes:
                break
            try:
                os.unlink(path)
            except FileNotFoundError:  # another process evicted it first
                pass
            total -= size

    @property
    def bytes(self) -> int:
        """Bytes of complete shards in the cache now."""
        if not self.folder.exists():
            return 0
        return sum(e.stat().st_size for e in os.scandir(self.folder) if e.is_file() and not e.name.startswith(".download-"))
