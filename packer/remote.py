"""Remote SRC and DST through fsspec URLs (``pip install 'packer[remote]'``; s3:// needs s3fs).

* DST (WebDataset shards or a blob): the conversion runs into a local temporary folder. For
  WebDataset, each shard is uploaded by a background thread as soon as the writer publishes it
  (finished and renamed into ``DST.partial``), while the conversion goes on; when it is done,
  the index and checksum files follow, and the metadata record last, so a reader that finds
  the metadata finds every shard it lists. A blob is one file, uploaded when finished. Local
  disk still holds the whole output once (the resume checkpoints sync published shards);
  local files are deleted as the final upload passes them. A failed conversion removes what it
  had uploaded.
* SRC: the image folder at the URL is copied into the local temporary folder first (fsspec
  ``get``), then converted as a local folder; skipped inputs are recorded by their path
  relative to SRC, as for a local SRC.

An existing remote DST is refused unless ``overwrite``; ``resume`` is not offered remotely.
"""

from __future__ import annotations

import dataclasses
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from readers.formats.webdataset import META_FILE
from readers.remote import is_url

from .errors import OptionError, OutputError, SourceError

__all__ = ["is_url", "convert_remote", "upload", "REMOTE_FORMATS"]

#: Formats that can be written to a URL (self-contained files a reader can stream or fetch).
REMOTE_FORMATS = ("webdataset", "blob")


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError:
        raise OptionError(f"{url}: remote SRC/DST needs fsspec (and s3fs for s3://): pip install 'packer[remote]'") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise OptionError(f"{url}: {exc} (pip install 'packer[remote]')") from None


class _ShardUploader:
    """A thread that uploads each shard published into ``partial`` (a finished ``*.tar`` renamed
    there by the writer) to ``url`` while the conversion runs."""

    def __init__(self, partial: Path, url: str) -> None:
        self.partial, self.url = partial, url
        self.fs, root = _filesystem(url)
        self.root = root.rstrip("/")
        self.uploaded: set[str] = set()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="packer-upload", daemon=True)
        self._thread.start()

    def _pass(self) -> None:
        if not self.partial.is_dir():
            return
        for path in sorted(self.partial.iterdir()):
            if path.name.endswith(".tar") and not path.name.startswith(".") and path.name not in self.uploaded:
                self.fs.put_file(str(path), f"{self.root}/{path.name}")
                self.uploaded.add(path.name)

    def _run(self) -> None:
        try:
            while not self._stop.wait(0.2):
                self._pass()
        except BaseException as exc:  # noqa: BLE001 - raised in the caller by stop()
            self.error = exc

    def stop(self) -> set[str]:
        """Stop the thread; the names it uploaded (raises what it failed with)."""
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise OutputError(f"{self.url}: upload failed ({self.error})") from None
        return self.uploaded


def upload(local: Path, url: str, *, overwrite: bool = False, done: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """Copy the finished output ``local`` (a folder or one file) to ``url``: files one by one,
    each deleted locally once uploaded, :data:`META_FILE` last; names in ``done`` are already
    there (uploaded while converting)."""
    fs, root = _filesystem(url)
    root = root.rstrip("/")
    if fs.exists(root) and not done:
        if not overwrite:
            raise OutputError(f"{url}: already exists; pass --overwrite to replace it")
        fs.rm(root, recursive=True)
    try:
        if local.is_file():
            fs.put_file(str(local), root)
            local.unlink()
            return
        files = sorted((p for p in local.iterdir() if p.is_file()), key=lambda p: (p.name == META_FILE, p.name))
        for path in files:
            if path.name not in done:
                fs.put_file(str(path), f"{root}/{path.name}")
            path.unlink()
    except OSError as exc:
        raise OutputError(f"{url}: upload failed ({exc}); the metadata was not written, so readers refuse the partial copy") from None


def convert_remote(convert: Callable[..., Any], src: str | Path, dst: str | Path, *, format: str | None, overwrite: bool,
                   resume: bool, **options: Any) -> Any:
    """``convert(src, dst, ...)`` where SRC and/or DST are URLs: stage, convert locally, upload."""
    from .api import resolve_format

    if resume:
        raise OptionError("--resume: not offered for a remote SRC or DST; convert again")
    fmt = resolve_format(str(dst), format) if is_url(str(dst)) else format
    if is_url(str(dst)) and fmt not in REMOTE_FORMATS:
        raise OptionError(f"{dst}: a remote DST must be one of {', '.join(REMOTE_FORMATS)} (got {fmt}); convert locally and copy")
    if is_url(str(dst)) and "%" in str(dst).rstrip("/").rsplit("/", 1)[-1]:
        # a shard name pattern (s3://b/train/train-%06d.tar): the folder URL holds the output
        folder_url, pattern = str(dst).rstrip("/").rsplit("/", 1)
        local_pattern = f"{folder_url.rsplit('/', 1)[-1]}/{pattern}"
    else:
        folder_url, local_pattern = str(dst).rstrip("/"), ""
    if is_url(str(dst)):
        fs, root = _filesystem(folder_url)
        if fs.exists(root.rstrip("/")):
            if not overwrite:
                raise OutputError(f"{dst}: already exists; pass --overwrite to replace it")
            fs.rm(root.rstrip("/"), recursive=True)
    with tempfile.TemporaryDirectory(prefix="packer-remote-") as tmp:
        local_src: str | Path = src
        if is_url(str(src)):
            fs, root = _filesystem(str(src))
            if not fs.isdir(root):
                raise SourceError(f"{src}: no such folder; SRC must be a folder of images (class sub-folders = labels)")
            local_src = Path(tmp) / "src"
            fs.get(root.rstrip("/") + "/", str(local_src), recursive=True)
        if not is_url(str(dst)):
            local_dst = Path(dst)
        else:
            local_dst = Path(tmp) / "out" / (local_pattern or folder_url.rsplit("/", 1)[-1])
        (Path(tmp) / "out").mkdir()  # a pattern's own folder is made by the writer
        uploader = None
        if is_url(str(dst)) and fmt == "webdataset":
            from .writers.base import partial_path
            from .writers.webdataset import split_destination

            uploader = _ShardUploader(partial_path(split_destination(local_dst)[0]), folder_url)
        try:
            report = convert(local_src, local_dst, format=fmt, overwrite=overwrite, resume=False, **options)
            done = uploader.stop() if uploader is not None else set()
            if is_url(str(dst)):
                upload(Path(report.dst), folder_url, overwrite=overwrite, done=done)
                report = dataclasses.replace(report, dst=str(dst))
        except BaseException:
            if uploader is not None:
                uploader._stop.set()
                uploader._thread.join()
                try:  # what was uploaded of a failed conversion (no metadata: no reader accepts it)
                    if uploader.uploaded:
                        uploader.fs.rm(uploader.root, recursive=True)
                except OSError:
                    pass
            raise
    return report
