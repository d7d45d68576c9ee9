"""Arguments of a torch ``DataLoader`` or an FFCV ``Loader`` given to packer's :class:`~readers.loader.Loader`.

``Loader(ds, 64, num_workers=4)`` raised Python's plain "unexpected keyword argument": a user
coming from those loaders learnt nothing of the Loader's own name for it. :data:`FOREIGN` maps
each such name to what to pass instead (README, *Coming from FFCV...*); :func:`refuse_foreign`
raises a one-line ``TypeError`` naming it. None is accepted silently: their meaning differs
(worker processes are not threads, a ``collate_fn`` has no place in a batch filled in place).
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["FOREIGN", "refuse_foreign"]

_NO_WORKERS = "none, the Loader has no worker processes: threads= fill whole batches in this process"

#: A DataLoader's or FFCV's argument name -> the Loader's way of saying it.
FOREIGN: dict[str, str] = {
    # torch.utils.data.DataLoader
    "num_workers": "use threads= (filling threads in this process, not worker processes)",
    "pin_memory": "use device='cuda' (batches are filled into pinned buffers and copied to the GPU for you)",
    "pin_memory_device": "use device= (e.g. device='cuda:1': pinned buffers, copied to that device)",
    "prefetch_factor": "use prefetch= (batches filled ahead, over all threads)",
    "sampler": "use shuffle=, seed=, rank=/world_size= or indices= (the Loader plans its own order; ResumableSampler is for a DataLoader)",
    "batch_sampler": "use batch_size=, shuffle=, drop_last=, rank=/world_size= (the Loader plans its own batches)",
    "collate_fn": "none, batches are uint8 (N, C, H, W) tensors filled in place; transform whole batches (readers.gpu), "
                  "or read the dataset with a torch DataLoader",
    "generator": "use seed= (and set_epoch(e) to choose an epoch)",
    "persistent_workers": _NO_WORKERS,
    "worker_init_fn": _NO_WORKERS,
    "multiprocessing_context": _NO_WORKERS,
    "timeout": "none, an error while filling a batch is raised by the iteration at that batch",
    # FFCV's Loader
    "order": "use shuffle=True (OrderOption.RANDOM) or shuffle=False (SEQUENTIAL); QUASI_RANDOM: none, stream data larger "
             "than RAM with readers.StreamingShards",
    "os_cache": "open the dataset with readers.RAMDataset(path) (the blob copied into RAM once); LMDB and HDF5 "
                "read through the page cache",
    "batches_ahead": "use prefetch= (batches filled ahead)",
    "distributed": "use rank=/world_size= (from torch.distributed by default)",
    "pipelines": "use device='cuda' (uint8 batches on the GPU), then readers.Normalize and friends on whole batches",
}


def refuse_foreign(given: Mapping[str, Any], owner: str = "Loader") -> None:
    """Raise ``TypeError`` for the first DataLoader/FFCV argument in ``given``, naming what to pass
    instead; names of neither are left to Python's own "unexpected keyword argument"."""
    for name, value in given.items():
        if name in FOREIGN:
            raise TypeError(f"{owner}({name}={value!r}): a torch DataLoader / FFCV argument, not {owner}'s: {FOREIGN[name]}")
