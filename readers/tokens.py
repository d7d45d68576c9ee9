"""Torch datasets over packed token ids: training blocks or whole documents, in any format.

``TokenDataset(path, block_size=1024)`` serves fixed-length blocks of the flat token stream
(every document back to back, EOS-separated): item ``i`` is ``(x, y)``, ``block_size`` tokens of
input and the next-token targets, as uint16/uint32 tensors (half or a quarter of int64 over the
host-to-device copy); :class:`WidenTokens` widens them to int64 on the device. Blocks are
non-overlapping (block ``i`` starts at token ``i * block_size``; the last one ends inside the
stream), or with ``random_windows=True`` start anywhere, drawn from ``(seed, i)`` and the epoch
(:meth:`TokenDataset.set_epoch`, which :class:`readers.Loader` and :class:`readers.ResumableSampler`
call at each iteration): fresh windows every epoch, as nanoGPT's ``get_batch`` draws new ones (it
does each batch), the same ones again for the same epoch (a resume). Without ``block_size``,
item ``i`` is document ``i``.

:meth:`TokenDataset.read_batch` fills ``(N, block_size + 1)`` windows (inputs ``w[:, :-1]``,
targets ``w[:, 1:]``) for :class:`readers.Loader`; its labels are each window's start position in the stream.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from .epoch import positive_number, whole_number
from .formats.base import checked_index
from .formats.tokens import TokenStore
from .schema import Metadata

__all__ = ["TokenDataset", "WidenTokens"]


class TokenDataset(Dataset):
    """Training blocks (``block_size``) or documents of a packed text dataset (an
    :class:`~readers.epoch.EpochItems`: its index names a block, a window or a document).

    ``expect_tokenizer``: ``"bytes"``, a tokenizer file or its sha256; a dataset made with another
    tokenizer is refused. ``in_memory``: a blob is copied once into shared memory (as
    :class:`readers.RAMDataset`); other formats refuse it (``ValueError``). ``verify=True``: every document a
    read touches is checked against its stored checksum, once per process
    (:class:`readers.formats.tokens.TokenStore`); a damaged one raises
    :class:`readers.checksums.CorruptSampleError`. Off by default, as for raw image samples.
    """

    def __init__(
        self,
        path: str | Path,
        block_size: int | None = None,
        random_windows: bool = False,
        seed: int = 0,
        *,
        expect_tokenizer: str | os.PathLike[str] | None = None,
        in_memory: bool = False,
        verify: bool = False,
    ) -> None:
        if block_size is not None:  # (a numpy integer from a config too; never True, which was one-token blocks)
            block_size = positive_number(block_size, "block_size")
        if random_windows and block_size is None:
            raise ValueError("random_windows needs a block_size")
        self.tokens = TokenStore(path, expect_tokenizer=expect_tokenizer, in_memory=in_memory, verify=verify)
        self.block_size = block_size
        self.random_windows = random_windows
        self.seed = seed
        #: The epoch random windows are drawn for, in shared memory: DataLoader workers, persistent too, follow it.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        if block_size is not None and self.tokens.num_tokens < block_size + 1:
            raise ValueError(f"{path}: {self.tokens.num_tokens} tokens is too few for one block of {block_size} (+1 target)")

    @property
    def meta(self) -> Metadata:
        return self.tokens.meta

    def __len__(self) -> int:
        if self.block_size is None:
            return len(self.tokens)
        return (self.tokens.num_tokens - 1) // self.block_size

    @property
    def item_identity(self) -> str:
        """What an index names, for a resume state's fingerprint (readers/epoch.py): a state saved
        over blocks of another size, or random windows of another seed, reads other tokens."""
        if self.block_size is None:
            return "documents"
        return f"blocks of {self.block_size} tokens, " + (f"random windows of seed {self.seed}" if self.random_windows else "consecutive")

    @property
    def epoch(self) -> int:
        """The epoch whose random windows are read (0 until :meth:`set_epoch`)."""
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Draw random windows for ``epoch`` (nothing changes for blocks or documents): the Loader
        and ResumableSampler call it at each iteration; call it yourself with another sampler."""
        self._epoch.fill_(whole_number(epoch, "set_epoch: epoch"))

    def window_start(self, index: int) -> int:
        """First token of block ``index`` in the flat stream."""
        n = len(self)
        index = checked_index(index, n, "TokenDataset", f"block {index} is out of range for {n} blocks")  # (as the datasets)
        assert self.block_size is not None
        if not self.random_windows:
            return index * self.block_size
        high = self.tokens.num_tokens - self.block_size  # start + block_size + 1 <= num_tokens
        epoch = int(self._epoch)  # (epoch 0 draws as before epochs were drawn from)
        return int(np.random.default_rng((self.seed, index) if not epoch else (self.seed, index, epoch)).integers(0, high))

    def __getitem__(self, index: int) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.block_size is None:
            return torch.from_numpy(_native(self.tokens.document(index)))
        start = self.window_start(index)
        window = torch.from_numpy(_native(self.tokens.span(start, start + self.block_size + 1)))
        return window[:-1], window[1:]

    def read_batch(self, indices: Sequence[int], out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Windows ``(N, block_size + 1)`` of the stored dtype into ``out`` (or new), and their int64 starts."""
        if self.block_size is None:
            raise ValueError(f"{self.tokens.path}: documents have different lengths; pass block_size for batches")
        idx = np.asarray(indices, np.int64).reshape(-1)
        shape = (len(idx), self.block_size + 1)
        dtype = self.tokens.dtype.newbyteorder("=")
        if out is None:
            out = np.empty(shape, dtype)
        elif out.shape != shape or out.dtype != dtype:
            raise ValueError(f"out must be a {dtype} array of shape {shape}, got {out.dtype} {out.shape}")
        starts = np.empty(len(idx), np.int64)
        for j, i in enumerate(idx.tolist()):
            starts[j] = start = self.window_start(i)
            self.tokens.span(start, start + self.block_size + 1, out[j])
        return out, starts

    def decode(self, ids: Sequence[int] | np.ndarray | torch.Tensor, tokenizer: str | os.PathLike[str] | None = None) -> str:
        """Text of ``ids`` (inspection); the tokenizer file recorded at conversion unless given."""
        if isinstance(ids, torch.Tensor):
            ids = ids.detach().cpu().to(torch.int64).numpy()
        return self.tokens.decode(ids, tokenizer)

    def __repr__(self) -> str:
        mode = f"block_size={self.block_size}{', random' if self.random_windows else ''}" if self.block_size else "documents"
        return f"TokenDataset({str(self.tokens.path)!r}, {len(self)} items, {mode}, {self.meta.dtype})"


def _native(array: np.ndarray) -> np.ndarray:
    """The array in native byte order (a no-op on little-endian machines)."""
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


class WidenTokens(nn.Module):
    """uint16/uint32 token ids -> int64 (for ``nn.Embedding`` and the loss), after the copy to the device."""

    def __init__(self, dtype: torch.dtype = torch.int64) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens.to(self.dtype)

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}"
