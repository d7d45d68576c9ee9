"""The peer tools, each on its own format and with its own loader, fed the same preprocessed images.

* webdataset: ``ShardWriter`` tar shards, read by ``WebDataset(...).shuffle().decode()`` +
  ``WebLoader`` (the library's documented pipeline);
* MosaicML Streaming: ``MDSWriter`` shards, read by ``StreamingDataset`` in a ``DataLoader``;
* LitData: ``litdata.optimize`` chunks, read by ``StreamingDataset`` + ``StreamingDataLoader``,
  with its default ``batch_decode`` and with ``batch_decode=0`` (per item).

Every peer stores exactly what packer stores (224x224 centre crops made by packer's own
preprocessing, as raw uint8 or JPEG quality 90), so only storage and loading differ. Conversion
time includes the decode and resize (a pool of ``workers`` processes, as packer's). A peer that
cannot be imported or fails reports why instead of disappearing. Install them with
``benchmarks/install_peers.sh`` (``--no-deps``: their declared dependencies pull another torch).
"""

from __future__ import annotations

import gc
import importlib.metadata
import io
import math
import sys
import time
import types
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader

from packer import ImageOptions
from packer.bench import Rate, collate, epoch_of, for_at_least, measure
from packer.preprocess.encode import encode
from packer.preprocess.image import preprocess_image

__all__ = ["PEERS", "peer_versions", "Peer"]

OPTIONS = ImageOptions(size=224)
Item = tuple[str, int]


def _prepare(job: tuple[str, int, str]) -> tuple[bytes | np.ndarray, int]:
    """One source file -> (CHW uint8 array, or JPEG bytes), label: packer's preprocessing."""
    path, label, encoding = job
    with open(path, "rb") as handle:
        pixels = preprocess_image(handle.read(), OPTIONS)
    if encoding == "jpeg":
        return encode(pixels, "jpeg", 90), label
    return np.ascontiguousarray(pixels.transpose(2, 0, 1)), label


def prepared(items: Sequence[Item], encoding: str, workers: int) -> Iterator[tuple[bytes | np.ndarray, int]]:
    """Preprocessed samples in order, made by ``workers`` processes (1: in this process)."""
    jobs = [(path, label, encoding) for path, label in items]
    if workers == 1:
        yield from map(_prepare, jobs)
        return
    with get_context("fork").Pool(workers) as pool:
        yield from pool.imap(_prepare, jobs, chunksize=16)


def _to_chw(image: Any) -> torch.Tensor:
    """A decoded peer image (HWC numpy/PIL or CHW array/tensor) as a CHW uint8 tensor."""
    if isinstance(image, torch.Tensor):
        return image if image.shape[0] in (1, 3) else image.permute(2, 0, 1)
    array = np.asarray(image)
    if not array.flags.writeable:
        array = array.copy()  # peers hand out read-only views; torch wants writable memory
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        return torch.from_numpy(array)
    return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)


def dict_collate(batch: Sequence[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Streaming/LitData samples ({"image", "label"}) -> (N, C, H, W) uint8, (N,) int64 (packer.bench.collate's copy)."""
    return collate([(_to_chw(s["image"]), int(s["label"])) for s in batch])


def tuple_collate(batch: Sequence[tuple[Any, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(image, label) samples -> (N, C, H, W) uint8, (N,) int64 (packer.bench.collate's copy)."""
    return collate([(_to_chw(image), int(label)) for image, label in batch])


def full_epochs(loader: Any, seconds: float) -> Callable[[], int]:
    """A timed pass of whole epochs (at least ``seconds``): the peers' iterable datasets keep
    per-epoch state (shuffle buffers, resumable partitions), and LitData's workers abort when an
    epoch is abandoned half way."""
    return for_at_least(seconds, epoch_of(loader))


class Peer:
    """A peer tool: ``write`` its format (timed by the caller), ``read`` rates per loader setting."""

    name = ""
    package = ""

    def available(self) -> str | None:
        """``None`` if usable, else why not."""
        try:
            self._import()
        except Exception as exc:  # noqa: BLE001 - reported in the results
            return f"cannot import ({type(exc).__name__}: {exc}); install with benchmarks/install_peers.sh"
        return None

    def version(self) -> str:
        return importlib.metadata.version(self.package)

    def _import(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def write(self, items: Sequence[Item], dst: Path, encoding: str, workers: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def read(self, dst: Path, *, settings: Sequence[int], batch_size: int, seconds: float, repeats: int) -> dict[str, Rate | str]:
        raise NotImplementedError  # pragma: no cover


class WebDatasetPeer(Peer):
    name = "webdataset"
    package = "webdataset"

    def _import(self) -> Any:
        import webdataset

        return webdataset

    def write(self, items: Sequence[Item], dst: Path, encoding: str, workers: int) -> None:
        wds = self._import()
        dst.mkdir(parents=True)
        per_shard = max(1, math.ceil(len(items) / 8))  # enough shards for every worker
        ext = "jpg" if encoding == "jpeg" else "npy"
        with wds.ShardWriter(str(dst / "shard-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
            for i, (payload, label) in enumerate(prepared(items, encoding, workers)):
                sink.write({"__key__": f"{i:08d}", ext: payload, "cls": str(label).encode()})

    def read(self, dst: Path, *, settings: Sequence[int], batch_size: int, seconds: float, repeats: int) -> dict[str, Rate | str]:
        wds = self._import()
        urls = sorted(str(p) for p in dst.glob("*.tar"))
        ext = "jpg" if any(dst.glob("*.tar")) and _tar_has(urls[0], ".jpg") else "npy"
        out: dict[str, Rate | str] = {}
        for workers in settings:
            pipeline = (
                wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
                .shuffle(1000)
                .decode("rgb8")
                .to_tuple(ext, "cls")
                .batched(batch_size, collation_fn=tuple_collate)
            )
            loader = wds.WebLoader(pipeline, batch_size=None, num_workers=workers, persistent_workers=workers > 0)
            out[f"WebLoader(num_workers={workers})"] = measure(full_epochs(loader, seconds), repeats=repeats)
            del loader, pipeline
            gc.collect()
        return out


def _tar_has(url: str, suffix: str) -> bool:
    import tarfile

    with tarfile.open(url) as tar:
        return any(name.endswith(suffix) for name in tar.getnames()[:4])


def _stub_streaming_vision() -> None:
    """``import streaming`` imports ``streaming.vision``, which needs torchvision: stand in for it."""
    if "streaming.vision" not in sys.modules:
        stub = types.ModuleType("streaming.vision")
        stub.__path__ = []  # a package, so its submodules fail cleanly if anything asks for them
        sys.modules["streaming.vision"] = stub


class StreamingPeer(Peer):
    name = "mosaicml-streaming (MDS)"
    package = "mosaicml-streaming"

    def _import(self) -> Any:
        _stub_streaming_vision()
        import streaming

        return streaming

    def write(self, items: Sequence[Item], dst: Path, encoding: str, workers: int) -> None:
        streaming = self._import()
        from PIL import Image

        column = "jpeg" if encoding == "jpeg" else "ndarray:uint8:3,224,224"
        with streaming.MDSWriter(out=str(dst), columns={"image": column, "label": "int"}, size_limit=1 << 26) as sink:
            for payload, label in prepared(items, encoding, workers):
                image = Image.open(io.BytesIO(payload)) if encoding == "jpeg" else payload
                sink.write({"image": image, "label": int(label)})

    def read(self, dst: Path, *, settings: Sequence[int], batch_size: int, seconds: float, repeats: int) -> dict[str, Rate | str]:
        streaming = self._import()
        from streaming.base.util import clean_stale_shared_memory

        out: dict[str, Rate | str] = {}
        for workers in settings:
            clean_stale_shared_memory()
            dataset = streaming.StreamingDataset(local=str(dst), shuffle=True, batch_size=batch_size)
            loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0, collate_fn=dict_collate)
            try:
                out[f"DataLoader(num_workers={workers})"] = measure(full_epochs(loader, seconds), repeats=repeats)
            finally:
                del loader, dataset
                gc.collect()
                clean_stale_shared_memory()
        return out


def _litdata_sample(job: tuple[str, int, str]) -> dict[str, Any]:
    """LitData's ``optimize`` work function (module level: its workers import it)."""
    payload, label = _prepare(job)
    if isinstance(payload, bytes):
        from PIL import Image

        return {"image": Image.open(io.BytesIO(payload)), "label": label}
    return {"image": payload, "label": label}


class LitDataPeer(Peer):
    name = "litdata"
    package = "litdata"

    def _import(self) -> Any:
        import litdata

        return litdata

    def write(self, items: Sequence[Item], dst: Path, encoding: str, workers: int) -> None:
        litdata = self._import()
        jobs = [(path, label, encoding) for path, label in items]
        litdata.optimize(fn=_litdata_sample, inputs=jobs, output_dir=str(dst), num_workers=workers, chunk_bytes="64MB", verbose=False)

    def read(self, dst: Path, *, settings: Sequence[int], batch_size: int, seconds: float, repeats: int) -> dict[str, Rate | str]:
        litdata = self._import()
        out: dict[str, Rate | str] = {}
        for decode, label in (("auto", "default"), (0, "batch_decode=0")):
            for workers in settings:
                key = f"StreamingDataLoader(num_workers={workers}), {label}"
                try:
                    dataset = litdata.StreamingDataset(str(dst), shuffle=True, batch_decode=decode)
                    loader = litdata.StreamingDataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=dict_collate)
                    out[key] = measure(full_epochs(loader, seconds), repeats=repeats)
                except Exception as exc:  # noqa: BLE001 - reported in the results
                    out[key] = f"failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
                finally:
                    loader = dataset = None
                    gc.collect()
        return out


PEERS: tuple[Peer, ...] = (WebDatasetPeer(), StreamingPeer(), LitDataPeer())


def peer_versions() -> dict[str, str]:
    """Installed version of each peer, or why it is missing."""
    out = {}
    for peer in PEERS:
        try:
            out[peer.package] = peer.version()
        except importlib.metadata.PackageNotFoundError:
            out[peer.package] = "not installed"
    return out


def timed_write(peer: Peer, items: Sequence[Item], dst: Path, encoding: str, workers: int, remove: Callable[[Path], None]) -> float:
    """Images/s of one peer conversion (``dst`` replaced)."""
    remove(dst)
    start = time.perf_counter()
    peer.write(items, dst, encoding, workers)
    return len(items) / (time.perf_counter() - start)
