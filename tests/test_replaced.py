"""A dataset replaced by a conversion's --overwrite while a reader reads it: a process (a
DataLoader worker of a later epoch) or a shard opened afterwards raises DatasetReplacedError,
where it read the new dataset mixed with the old (a walkthrough's epoch held samples of both,
images and labels of different datasets, or died on "sample 99 is missing or truncated")."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader

from packer import ImageOptions, StorageOptions, convert
from readers import DatasetReplacedError, open_dataset
from readers.webdataset import StreamingShards

OLD, NEW = ImageOptions(size=8), ImageOptions(size=12)


@pytest.mark.parametrize("name, fmt", [("d.lmdb", "lmdb"), ("d.h5", "hdf5"), ("d.blob", "blob"), ("m.blob", "mapped blob"), ("d", "webdataset")])
def test_a_process_that_opens_a_replaced_dataset_refuses_it(image_folder, tmp_path, name, fmt):
    storage = StorageOptions(shard_size=4) if fmt == "webdataset" else None
    dst = tmp_path / name
    convert(image_folder, dst, format=fmt.split()[-1], image=OLD, storage=storage, workers=1)
    ds = open_dataset(dst, in_memory=False) if fmt == "mapped blob" else open_dataset(dst)
    first = ds[0][0].clone()
    assert first.shape == (3, 8, 8)
    sent = pickle.dumps(ds)  # what a spawned worker is given (it opens the dataset itself)
    new = OLD if fmt == "mapped blob" else NEW  # (converted again as it was: the same header, another file all the same)
    convert(image_folder, dst, format=fmt.split()[-1], image=new, storage=storage, workers=1, overwrite=True)
    assert open_dataset(dst)[0][0].shape == (3, *new.size)  # (the new one is there)
    assert torch.equal(ds[0][0], first)  # this process's open dataset keeps reading the old one
    with pytest.raises(DatasetReplacedError, match=rf"^{dst}: replaced since this reader opened it .* open it again"):
        pickle.loads(sent)[0]
    if fmt == "webdataset":  # a shard this process had not opened yet
        with pytest.raises(DatasetReplacedError, match="replaced since this reader opened it"):
            ds[len(ds) - 1]
    elif fmt == "blob":  # in memory (RAMDataset): a forked worker reads its parent's copy, the old dataset whole
        assert torch.equal(next(iter(DataLoader(ds, batch_size=6, num_workers=1, multiprocessing_context="fork")))[0][0], first)
    else:  # a forked DataLoader worker opens it afresh
        with pytest.raises(DatasetReplacedError, match="replaced since this reader opened it"):
            list(DataLoader(ds, batch_size=6, num_workers=1, multiprocessing_context="fork"))


def test_streaming_shards_replaced_mid_epoch_stop_at_the_next_shard(image_folder, tmp_path):
    dst = tmp_path / "d"
    convert(image_folder, dst, format="webdataset", image=OLD, storage=StorageOptions(shard_size=4), workers=1)
    stream = iter(StreamingShards(dst))
    seen = [next(stream)[0].shape for _ in range(3)]  # inside the first shard
    convert(image_folder, dst, format="webdataset", image=NEW, storage=StorageOptions(shard_size=4), workers=1, overwrite=True)
    seen.append(next(stream)[0].shape)  # (the first shard is open: its last sample still comes)
    with pytest.raises(DatasetReplacedError, match=rf"^{dst}: replaced since this reader opened it"):
        next(stream)
    assert seen == [(3, 8, 8)] * 4
    assert {tuple(image.shape) for image, _ in StreamingShards(dst)} == {(3, 12, 12)}  # opened again: the new one
