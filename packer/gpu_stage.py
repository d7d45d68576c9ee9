"""``packer convert --decode-device cuda``: JPEGs decoded with nvJPEG and resized on the GPU.

The work is split so that the GPU is used by ONE process with one CUDA context, never one per
worker:

* The workers (the same pool, the same crash isolation and timeouts) run :class:`FetchTask` /
  :class:`FetchMemberTask` (packer/preprocess/fetch.py, a module without torch): they read each input's bytes and look at its header. A plain JPEG
  (complete, RGB or gray, within ``--max-pixels``) comes back as :class:`Fetched` (its bytes,
  through the pool's shared-memory transport); anything else (PNG, WebP, CMYK or truncated JPEGs,
  ``.npy`` members) is converted on the CPU right there, exactly as without the option, and
  comes back as an :class:`~packer.preprocess.task.Encoded` sample or a
  :class:`~packer.preprocess.task.Failed`.
* The driving process runs :class:`GPUStage` over the outcomes, in order (the job's ``stage``,
  packer/engine.py): it decodes the :class:`Fetched` inputs of each run of :data:`BATCH` outcomes
  in one batched nvImageCodec call (readers/nvjpeg.py), crops, resizes and pads each on the GPU
  to the CPU path's output geometry (packer/preprocess/tensor_resize.py), and hands the same
  ``Encoded`` samples (uint8 CHW payloads) to the same writer. An input the GPU decoder refuses
  is converted on the CPU in this process instead (same result or same skip reason as the CPU path).

``--encoding jpeg``/``png`` outputs are encoded on the CPU, in this one process. Refused, in one
line: with ``--executor ray`` (tasks on other machines), WebDataset output (its workers write
their own shards) and a Python dataset SRC (its images arrive decoded). Built and tested on the
CPU (a stand-in decoder, the resize's fidelity), and run on a lent H100: ``python -m
benchmarks.gpu_decode --seconds 2`` (benchmarks/results/gpu_decode.json) measures it beside the
CPU path on the same host, where 16 CPU workers still convert faster than this one process
(docs/SCALING.md).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Iterable, Iterator

import torch

from readers.nvjpeg import GPUDecoder, GPUDecodeUnavailable, load_nvimgcodec, require_cuda

from .errors import OptionError
from .options import ImageOptions
from .preprocess.encode import encode
from .preprocess.fetch import Fetched, FetchMemberTask, FetchParquetRowTask, FetchTask
from .preprocess.members import MemberTask, ParquetRowTask
from .preprocess.task import Encoded, Failed, ImageTask
from .writers import get_writer
from .writers.piece_writer import PieceWriter

__all__ = ["Fetched", "FetchTask", "FetchMemberTask", "GPUStage", "gpu_job", "check_gpu_conversion", "BATCH", "OPTION"]

log = logging.getLogger("packer")

#: Outcomes gathered before one batched decode on the GPU.
BATCH = 64
#: The option, as messages name it.
OPTION = "--decode-device cuda"


def check_gpu_conversion(fmt: str, executor: str, python_dataset: bool) -> None:
    """Refuse, in one line, ``--decode-device cuda`` where it cannot apply."""
    if executor != "local":
        raise OptionError(f"{OPTION}: does not apply with --executor {executor} (it decodes in this machine's conversion process); drop one of them")
    if issubclass(get_writer(fmt), PieceWriter):
        raise OptionError(f"{OPTION}: does not apply to {fmt} output (its workers write their own shards); convert to a format "
                          "written sample by sample (lmdb, hdf5 or blob), or drop it")
    if python_dataset:
        raise OptionError(f"{OPTION}: does not apply to a Python dataset (its images arrive decoded: nothing to decode); drop it")


def gpu_job(job: Any, *, device: str = "cuda", backend: Any = None) -> Any:
    """``job`` (an image job) converted through the GPU: its workers fetch, a :class:`GPUStage` decodes.

    Checks here, before any worker starts or any output is opened, that CUDA and nvImageCodec are
    there (one line otherwise). ``backend``: a stand-in decoder (readers/nvjpeg.py), for tests."""
    image = dataclasses.replace(job.image, decode_device="cuda")  # what the metadata and --resume record
    if isinstance(job.task, MemberTask):
        task: Any = FetchMemberTask(image)
    elif isinstance(job.task, ParquetRowTask):
        task = FetchParquetRowTask(image)
    elif type(job.task) is ImageTask:
        task = FetchTask(image)
    else:
        raise OptionError(f"{OPTION}: does not apply to this source ({type(job.task).__name__}); drop it")
    return dataclasses.replace(job, task=task, image=image, stage=GPUStage(image, device=device, backend=backend))


class GPUStage:
    """The driving process's part (see the module doc): outcomes in, the same outcomes out, each
    :class:`Fetched` one replaced by its ``Encoded`` sample. The decoder is made on first use."""

    def __init__(self, options: ImageOptions, *, device: str = "cuda", backend: Any = None, batch: int = BATCH) -> None:
        self.options = options
        self.device = device
        self.batch = batch
        self._backend = backend
        self._decoder: GPUDecoder | None = None
        if backend is None:  # fail now, in one line, rather than after the workers have started
            try:
                require_cuda(device, OPTION)
                load_nvimgcodec(OPTION)
            except GPUDecodeUnavailable as exc:  # the CLI's one-line user error
                raise OptionError(str(exc)) from None

    @property
    def decoder(self) -> GPUDecoder:
        if self._decoder is None:
            self._decoder = GPUDecoder(self.device, channels=self.options.channels, what=OPTION, backend=self._backend)
        return self._decoder

    def __call__(self, outcomes: Iterable[Any]) -> Iterator[Any]:
        pending: list[Any] = []
        fetched = 0
        for outcome in outcomes:
            pending.append(outcome)
            fetched += isinstance(outcome, Fetched)
            if fetched >= self.batch:
                yield from self._flush(pending)
                pending, fetched = [], 0
        yield from self._flush(pending)

    def _flush(self, pending: list[Any]) -> Iterator[Any]:
        """``pending``'s outcomes in order, its :class:`Fetched` ones decoded in one call, resized
        by source size in a few batched calls, and copied to the host in one transfer."""
        fetched = [outcome for outcome in pending if isinstance(outcome, Fetched)]
        decoded = self.decoder.decode([f.data for f in fetched]) if fetched else []
        stored = dict(zip((i for i, d in enumerate(decoded) if d is not None), self._to_host([d for d in decoded if d is not None])))
        results = iter(self._encode(f, stored.get(i)) for i, f in enumerate(fetched))
        for outcome in pending:
            yield next(results) if isinstance(outcome, Fetched) else outcome

    def _to_host(self, images: list[Any]) -> list[Any]:
        """The stored pixels of decoded device images, as (C, h, w) uint8 host tensors: one copy."""
        if not images:
            return []
        from .preprocess.tensor_resize import preprocess_tensors  # torch's functional API, for this path only

        outs = preprocess_tensors(images, self.options)
        flat = torch.cat([out.reshape(-1) for out in outs]).cpu()  # one transfer and one wait per batch
        host, offset = [], 0
        for out in outs:
            host.append(flat[offset : offset + out.numel()].view(out.shape))
            offset += out.numel()
        return host

    def _encode(self, fetched: Fetched, out: Any) -> Encoded | Failed:
        """The stored sample of its (C, h, w) host pixels; ``None``: the CPU path's result."""
        if out is None:  # the GPU decoder refused it: the CPU path, here, said once per input
            log.warning("%s: the GPU decoder could not decode it; converting it on the CPU", fetched.path)
            return ImageTask(self.options).convert(fetched, fetched.data)
        if self.options.encoding == "raw":
            payload = out.numpy().tobytes()
        else:
            payload = encode(out.permute(1, 2, 0).contiguous().numpy(), self.options.encoding, self.options.quality or 90)
        channels, height, width = (int(d) for d in out.shape)
        return Encoded(fetched.label, (channels, height, width), payload)
