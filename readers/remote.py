"""Remote shards: URLs opened for streaming, the metadata beside them, and a bounded local cache.

:class:`~readers.webdataset.StreamingShards` reads shards from local paths, ``pipe:`` commands
and ``http(s)://`` URLs through the webdataset library's ``gopen`` (``curl`` for http), and from
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
import os
import tempfile
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlparse

__all__ = ["is_url", "open_shard", "read_url", "ShardCache", "GOPEN_SCHEMES"]

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


def open_shard(url: str) -> BinaryIO:
    """A binary stream of the shard at ``url``: ``gopen`` for paths, pipes and http(s), else fsspec."""
    if urlparse(url).scheme in GOPEN_SCHEMES or not is_url(url):
        from webdataset.gopen import gopen

        return gopen(url, "rb")
    return _fsspec().open(url, "rb").open()  # type: ignore[attr-defined]


def read_url(url: str) -> bytes | None:
    """The bytes at ``url``, or ``None`` if there is nothing there (a missing metadata file)."""
    if urlparse(url).scheme in ("http", "https"):
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - a URL the user gave
                return response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise OSError(f"{url}: the server answered HTTP {exc.code} ({exc.reason})") from None
        except (urllib.error.URLError, TimeoutError) as exc:  # refused, no such host, timed out
            raise OSError(f"{url}: cannot be read ({getattr(exc, 'reason', exc)})") from None
    fs, path = _fsspec().core.url_to_fs(url)  # type: ignore[attr-defined]
    try:
        with fs.open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


class ShardCache:
    """Whole shards downloaded into ``folder``, at most ``max_bytes`` of them (LRU by file mtime).

    Shared safely by the processes of one machine: downloads are renamed into place complete,
    and evicting a file another process is reading does not disturb that read (POSIX).
    """

    def __init__(self, folder: str | Path, max_bytes: int, version: str = "") -> None:
        """``version``: what tells this dataset from another at the same URLs (its metadata
        record): a dataset replaced at its URL was read from the cache as it was (3-channel
        samples under 1-channel metadata; an S3 walkthrough)."""
        if max_bytes < 1:
            raise ValueError(f"cache_bytes must be positive, got {max_bytes!r}")
        self.folder = Path(folder)
        self.max_bytes = int(max_bytes)
        self.version = version

    def path(self, url: str) -> Path:
        """Where ``url`` is cached: a digest of the URL (and the dataset's version) and its file name."""
        digest = hashlib.sha1(f"{self.version}\n{url}".encode() if self.version else url.encode()).hexdigest()[:16]
        return self.folder / f"{digest}-{url.rstrip('/').rsplit('/', 1)[-1]}"

    def open(self, url: str) -> BinaryIO:
        """The shard at ``url``, from the cache, downloading it first when missing."""
        target = self.path(url)
        if target.exists():
            os.utime(target)  # most recently used
            return open(target, "rb")
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".download-")
        try:
            with os.fdopen(fd, "wb") as out, open_shard(url) as stream:
                while chunk := stream.read(1 << 20):
                    out.write(chunk)
            self._evict(os.path.getsize(tmp))
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return open(target, "rb")

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
