"""The torch Datasets: indexing, the batched path, pickling and DataLoader workers."""

import json
import pickle
import shutil

import lmdb
import pytest
import torch
from torch.utils.data import DataLoader

from packer import ImageOptions, convert
from readers import (
    HDF5Dataset,
    IncompleteDatasetError,
    LMDBDataset,
    PackedFormatError,
    RAMDataset,
    ShardDataset,
    UnsupportedVersionError,
)
from readers.formats.lmdb import META_KEY, sample_key

#: Every map-style reader, by format. (The streaming WebDataset reader has its own tests.)
DATASETS = {"lmdb": LMDBDataset, "hdf5": HDF5Dataset, "webdataset": ShardDataset, "blob": RAMDataset}


@pytest.fixture(params=sorted(DATASETS))
def packed(request, packed_32):
    return DATASETS[request.param], packed_32(request.param)


def all_samples(ds):
    return [ds[i] for i in range(len(ds))]


def test_indexing(packed):
    cls, path = packed
    ds = cls(path)
    assert len(ds) == 18 and ds.classes == ["class_00", "class_01", "class_02"]
    image, label = ds[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 32, 32) and image.is_contiguous()
    assert isinstance(label, int) and label == 0
    assert torch.equal(ds[-1][0], ds[17][0]) and ds[-1][1] == 2
    with pytest.raises(IndexError, match="out of range"):
        ds[18]
    with pytest.raises(TypeError):
        ds["0"]  # type: ignore[index]


def test_batched_path_equals_per_sample_path(packed):
    cls, path = packed
    ds = cls(path)
    indices = [5, 0, 17, 5]
    batch = ds.__getitems__(indices)
    for (image, label), i in zip(batch, indices):
        assert torch.equal(image, ds[i][0]) and label == ds[i][1]
    images, labels = ds.read_batch(indices)
    assert images.shape == (4, 3, 32, 32) and labels.tolist() == [ds[i][1] for i in indices]


def test_transform_is_applied_per_sample(packed):
    cls, path = packed
    ds = cls(path, transform=lambda x: x.float().mean())
    value, _ = ds[3]
    assert value == ds.__getitems__([3])[0][0]


def test_pickles_without_handles(packed):
    cls, path = packed
    ds = cls(path)
    ds[0]  # opened in this process
    blob = pickle.dumps(ds)
    assert len(blob) < 10_000
    clone = pickle.loads(blob)
    assert torch.equal(clone[4][0], ds[4][0])


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers(packed, context):
    cls, path = packed
    ds = cls(path)
    want = all_samples(ds)  # read in the main process first: the workers must not reuse its handle
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=context)
    # fresh workers each epoch, each opening the file itself; a spawned worker inherits no handle, so
    # a second epoch of them would show nothing the first did not (and each spawn imports torch anew)
    for _epoch in range(2 if context == "fork" else 1):
        batches = list(loader)
        images = torch.cat([x for x, _ in batches])
        labels = torch.cat([y for _, y in batches])
        assert torch.equal(images, torch.stack([x for x, _ in want]))
        assert labels.tolist() == [y for _, y in want]


def test_several_datasets_over_one_file(packed):
    cls, path = packed
    train, val = cls(path), cls(path)
    subset = torch.utils.data.Subset(val, [1, 2])
    assert torch.equal(train[1][0], subset[0][0])
    for _epoch in range(2):  # a loader made anew every epoch
        assert sum(len(x) for x, _ in DataLoader(train, batch_size=5)) == 18


def test_reconverted_file_is_read_afresh(tmp_path, image_folder):
    dst = tmp_path / "again.lmdb"
    convert(image_folder, dst, image=ImageOptions(size=8), workers=1)
    first = LMDBDataset(dst)
    assert first[0][0].shape == (3, 8, 8)
    convert(image_folder, dst, image=ImageOptions(size=12), workers=1, overwrite=True)
    assert LMDBDataset(dst)[0][0].shape == (3, 12, 12)


def _rewrite_lmdb(src, dst, change):
    shutil.copytree(src, dst)
    env = lmdb.open(str(dst), subdir=True)
    with env.begin(write=True) as txn:
        change(txn)
    env.close()
    return dst


def test_newer_format_version_is_refused(tmp_path, lmdb_32):
    def bump(txn):
        meta = json.loads(txn.get(META_KEY))
        meta["format_version"] += 1
        txn.put(META_KEY, json.dumps(meta).encode())

    path = _rewrite_lmdb(lmdb_32, tmp_path / "new.lmdb", bump)
    with pytest.raises(UnsupportedVersionError, match="update packer"):
        LMDBDataset(path)


def test_missing_metadata_means_incomplete(tmp_path, lmdb_32):
    path = _rewrite_lmdb(lmdb_32, tmp_path / "nometa.lmdb", lambda txn: txn.delete(META_KEY))
    with pytest.raises(IncompleteDatasetError, match="did not finish"):
        LMDBDataset(path)


def test_truncated_sample_is_detected(tmp_path, lmdb_32):
    path = _rewrite_lmdb(lmdb_32, tmp_path / "cut.lmdb", lambda txn: txn.put(sample_key(3), txn.get(sample_key(3))[:-10]))
    ds = LMDBDataset(path)
    ds[2]
    with pytest.raises(PackedFormatError, match="sample 3 has 3062 bytes, expected 3072"):
        ds[3]


def test_not_a_dataset(tmp_path):
    with pytest.raises(FileNotFoundError):
        LMDBDataset(tmp_path / "nothing.lmdb")
    (tmp_path / "empty.lmdb").mkdir()
    with pytest.raises(PackedFormatError, match="not an LMDB"):
        LMDBDataset(tmp_path / "empty.lmdb")


def test_read_batch_refuses_a_dataset_with_a_transform(packed):
    """read_batch returned stored uint8 pixels with the dataset's transform skipped (a walkthrough):
    refused in one line, as Loader refuses such a dataset; indexing applies it."""
    cls, path = packed
    ds = cls(path, transform=lambda image: image.float() / 255)
    with pytest.raises(ValueError, match=r"read_batch returns the stored uint8 pixels and would skip this dataset's per-sample transform"):
        ds.read_batch([0, 1])
    assert ds[0][0].dtype == torch.float32
    assert cls(path).read_batch([0, 1])[0].dtype == torch.uint8

