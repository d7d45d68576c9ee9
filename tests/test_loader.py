"""readers.Loader and readers.CUDAPrefetcher, on the CPU (the CUDA paths need a GPU)."""

from __future__ import annotations

import gc
import re
import shutil
import struct
import threading
import time

import lmdb
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from readers import CUDAPrefetcher, LMDBDataset, Loader
from readers.epoch import ResumeError
from readers.open import open_dataset
from readers.schema import FORMATS, PackedFormatError


def packed_dataset(packed_32, fmt: str):
    """The 18-sample 32x32 dataset in ``fmt`` (a format that cannot be written or read fails)."""
    return open_dataset(packed_32(fmt))


def loader_threads() -> int:
    return sum(t.name.startswith("packer-loader") for t in threading.enumerate())


def wait_for_threads(count: int, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while loader_threads() > count and time.monotonic() < deadline:
        time.sleep(0.01)
    return loader_threads()


@pytest.fixture
def ds(lmdb_32):
    return LMDBDataset(lmdb_32)


def seen(loader: Loader, epoch: int | None = None) -> list[int]:
    return [int(i) for batch in loader.batch_indices(epoch) for i in batch]


def test_a_pass_closed_or_failed_early_does_not_move_on_and_one_stopped_at_its_count_does(ds):
    """Only a pass that handed out every batch moves on: ``close()`` mid-pass (a graceful stop,
    then a checkpoint) and a failed batch keep the epoch and the position (a resume must read the
    rest); a loop that stops at ``len(loader)`` without asking past it moves on at the next pass."""
    loader = Loader(ds, 4, seed=1, threads=2)
    for step, _batch in enumerate(loader):
        if step == 1:
            loader.close()
    assert step == 1 and loader.epoch == 0 and loader.state_dict()["samples_consumed"] == 8

    class Failing(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 20

        def __getitem__(self, i: int):
            if i == 9:
                raise OSError("disk gone")
            return torch.zeros(1, 1, 1, dtype=torch.uint8), i

    failing = Loader(Failing(), 4, shuffle=False, threads=1)
    it = iter(failing)
    next(it), next(it)
    with pytest.raises(OSError, match="disk gone"):
        next(it)
    assert list(it) == [] and failing.epoch == 0 and failing.state_dict()["samples_consumed"] == 8

    counted = Loader(ds, 4, seed=1, threads=2)
    orders = [[int(i) for _, (_images, labels) in zip(range(len(counted)), counted) for i in labels] for _ in range(3)]
    assert orders[0] != orders[1] != orders[2] and counted.epoch == 3  # (the third's last batch handed out: the next is epoch 3)


# -- contents and order ----------------------------------------------------------------------
def test_each_whole_pass_follows_the_next_epoch(ds):
    """As a DataLoader with ``shuffle=True`` reshuffles every pass (and FFCV's, Streaming's and
    LitData's loaders): a pass that runs out moves the loader on to the next epoch; one cut short
    does not; ``set_epoch`` still chooses, before a pass or during one."""
    index = {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}
    assert len(index) == len(ds)
    loader = Loader(ds, 4, seed=3, threads=2)

    def order() -> list[int]:
        return [index[image.numpy().tobytes()] for images, _labels in loader for image in images]

    first, second = order(), order()
    assert first == seen(loader, 0) and second == seen(loader, 1) and first != second and loader.epoch == 2
    for _batch in loader:
        break
    assert loader.epoch == 2 and order() == seen(loader, 2)
    loader.set_epoch(0)  # an epoch again: its order again
    assert order() == first and loader.epoch == 1
    it = iter(loader)
    next(it)
    loader.set_epoch(5)  # during a pass: the pass is epoch 1's, the next one epoch 5's
    list(it)
    assert loader.epoch == 5
    for _step, _batch in zip(range(len(loader)), loader):  # a counted pass over epoch 5, to its end
        pass
    loader.set_epoch(5)  # the same epoch again, chosen after the pass moved on (a mutation sweep)
    assert loader.epoch == 5 and loader.state_dict()["epoch"] == 5 and order() == seen(loader, 5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_sample_once_with_its_pixels(packed_32, fmt):
    ds = packed_dataset(packed_32, fmt)
    loader = Loader(ds, 4, shuffle=True, seed=1, threads=2, prefetch=2)
    assert len(loader) == 5  # 18 samples: 4+4+4+4+2
    got = []
    for (images, labels), indices in zip(loader, loader.batch_indices()):
        assert images.dtype == torch.uint8 and images.shape == (len(indices), 3, 32, 32) and images.is_contiguous()
        assert labels.dtype == torch.int64
        for j, i in enumerate(indices):
            image, label = ds[int(i)]
            assert torch.equal(images[j], image) and int(labels[j]) == label
        got.extend(int(i) for i in indices)
    assert sorted(got) == list(range(len(ds)))


def test_unshuffled_is_index_order(ds):
    loader = Loader(ds, 5, shuffle=False)
    assert seen(loader) == list(range(18))
    images, labels = next(iter(loader))
    assert torch.equal(images, torch.stack([ds[i][0] for i in range(5)]))


def test_shuffle_is_seeded_and_changes_per_epoch(ds):
    a, b, c = Loader(ds, 4, seed=0), Loader(ds, 4, seed=0), Loader(ds, 4, seed=1)
    assert seen(a) == seen(b) != seen(c)
    first = seen(a)
    a.set_epoch(1)
    assert seen(a) != first and sorted(seen(a)) == list(range(18))
    a.set_epoch(0)
    assert seen(a) == first
    # the yielded batches follow the plan
    labels = torch.cat([lab for _img, lab in a])
    assert labels.tolist() == [ds[i][1] for i in first]


def test_drop_last(ds):
    loader = Loader(ds, 4, drop_last=True, shuffle=False)
    assert len(loader) == 4 and [len(x) for x, _ in loader] == [4, 4, 4, 4]
    assert [len(x) for x, _ in Loader(ds, 4, shuffle=False)] == [4, 4, 4, 4, 2]


@pytest.mark.parametrize("drop_last", [False, True])
def test_two_ranks_split_the_epoch(ds, drop_last):
    # 18 samples: 2 ranks x 3 batches of 3 cover it exactly; 4 ranks must pad or drop 2 samples
    ranks = [Loader(ds, 3, seed=3, rank=r, world_size=2, drop_last=drop_last) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == sum(1 for _ in ranks[0])
    ranks[0].set_epoch(0)  # (that whole pass moved it on to epoch 1)
    parts = [seen(r) for r in ranks]
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == list(range(18))
    uneven = [Loader(ds, 1, seed=3, rank=r, world_size=4, drop_last=drop_last) for r in range(4)]
    counts = {len(seen(r)) for r in uneven}
    assert len(counts) == 1 and len({len(r) for r in uneven}) == 1
    union = [i for r in uneven for i in seen(r)]
    if drop_last:  # 16 of 18: the tail is dropped, nothing repeats
        assert len(union) == len(set(union)) == 16
    else:  # 20: two samples repeat, everything is covered
        assert len(union) == 20 and set(union) == set(range(18))


def test_bad_arguments(ds):
    with pytest.raises(ValueError, match="batch_size"):
        Loader(ds, 0)
    with pytest.raises(ValueError, match="rank"):
        Loader(ds, 4, rank=2, world_size=2)
    with pytest.raises(ValueError, match="buffers"):
        Loader(ds, 4, buffers="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="transform"):
        Loader(LMDBDataset(ds.path, transform=lambda x: x), 4)


@pytest.mark.parametrize("option, value, error", [
    ("threads", 1.7, TypeError), ("threads", 0, ValueError), ("threads", True, TypeError), ("prefetch", 2.5, TypeError),
    ("prefetch", -1.0, ValueError), ("prefetch", -1, ValueError), ("shuffle", "no", TypeError), ("shuffle", "false", TypeError),
    ("drop_last", "yes", TypeError), ("drop_last", 2, TypeError), ("device", "gpu", ValueError),
])
def test_an_option_of_the_wrong_kind_is_refused_not_cut_or_taken_as_true(ds, option, value, error):
    """threads=1.7 ran 1 thread, prefetch=2.5 kept 2, shuffle="false" (a config file's string)
    shuffled, and device="gpu" raised torch's list of every device type (a walkthrough): each is
    one line naming the option now. Integers, numpy integers and numpy bools still pass."""
    with pytest.raises(error, match=rf"^{option}={value!r}: the loader supports|^{option} must be .*got {re.escape(repr(value))}$"):
        Loader(ds, 4, **{option: value})
    loader = Loader(ds, 4, threads=np.int64(2), prefetch=np.int32(3), shuffle=np.bool_(False), drop_last=1)
    assert (loader.threads, loader.prefetch, loader.plan.shuffle, loader.plan.drop_last) == (2, 3, False, True)
    loader = Loader(ds, 4, threads=4 / 2, prefetch=1e1)  # whole numbers as floats (cores / 2, 1e4): taken
    assert (loader.threads, loader.prefetch) == (2, 10) and type(loader.threads) is int
    assert type(loader.plan.shuffle) is bool and type(loader.threads) is int


# -- threads ---------------------------------------------------------------------------------
def test_threads_stop_when_the_loop_breaks(ds):
    before = threading.active_count()
    loader = Loader(ds, 2, threads=2, prefetch=3)
    for _images, _labels in loader:
        assert loader_threads() == 2
        break
    gc.collect()
    assert wait_for_threads(0) == 0 and threading.active_count() == before
    # a full pass ends its threads too, and a new pass works after an abandoned one
    assert sum(len(x) for x, _ in loader) == 18
    assert wait_for_threads(0) == 0


def test_threads_stop_when_the_loader_is_collected(ds):
    before = threading.active_count()
    loader = Loader(ds, 2, threads=2)
    it = iter(loader)
    next(it)
    del it, loader
    gc.collect()
    assert wait_for_threads(0) == 0 and threading.active_count() == before


def test_close_stops_a_live_iteration(ds):
    loader = Loader(ds, 2, threads=2)
    it = iter(loader)
    next(it)
    loader.close()
    assert wait_for_threads(0) == 0
    with pytest.raises(StopIteration):
        next(it)


class Failing(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int):
        if i == 7:
            raise KeyError("sample 7 is broken")
        return torch.full((1, 2, 2), i, dtype=torch.uint8), i


def test_an_error_while_filling_is_raised_by_the_iteration():
    loader = Loader(Failing(), 2, shuffle=False, threads=2)
    it = iter(loader)
    assert [int(lab[0]) for _x, lab in (next(it), next(it), next(it))] == [0, 2, 4]
    with pytest.raises(KeyError, match="sample 7"):
        next(it)
    assert wait_for_threads(0) == 0


def test_plain_torch_dataset_fallback():
    class Plain(Dataset):
        def __len__(self) -> int:
            return 7

        def __getitem__(self, i: int):
            return np.full((2, 3), i, np.int32), i % 3

    batches = list(Loader(Plain(), 3, shuffle=False))
    assert [tuple(x.shape) for x, _ in batches] == [(3, 2, 3), (3, 2, 3), (1, 2, 3)]
    assert batches[1][0].dtype == torch.int32 and batches[1][0][:, 0, 0].tolist() == [3, 4, 5]
    assert batches[2][1].tolist() == [0]


@pytest.mark.parametrize("label, says", [
    (lambda i: 0.5 + i, "label 0.5 is a float"),  # (regression targets were cut to 0, 1, 2 without a word)
    (lambda i: torch.tensor([i, 1]), r"label has \(2,\) values"),  # (torch's 'only one element tensors' before)
    (lambda i: "cat", "label 'cat' is a str"),
])
def test_a_plain_dataset_label_that_is_no_class_index_is_refused(label, says):
    class Targets(Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int):
            return np.zeros((2, 3), np.uint8), label(i)

    with pytest.raises(TypeError, match=rf"^Loader: dataset\[0\]'s {says}: Loader batches one integer class label per sample; "
                                        "for other targets use a DataLoader$"):
        next(iter(Loader(Targets(), 4, shuffle=False)))


@pytest.mark.parametrize("label", [np.int64, torch.tensor, lambda i: torch.tensor([i]), lambda i: np.array([i]), bool, np.bool_])
def test_a_plain_dataset_label_of_any_integer_kind_is_taken(label):
    class Labeled(Dataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int):
            return np.zeros((2, 3), np.uint8), label(i)

    assert next(iter(Loader(Labeled(), 2, shuffle=False)))[1].tolist() == [0, 1]


def test_any_read_batch_source(ds):
    """A source that is only ``read_batch(indices, out)`` (tokens later): the store itself."""
    images, labels = next(iter(Loader(ds.store, 4, shuffle=False)))
    assert torch.equal(images, torch.stack([ds[i][0] for i in range(4)]))


def _lmdb_sample(txn, index: int) -> tuple[np.ndarray, int]:
    """Sample ``index`` read with lmdb itself (docs/FORMATS.md: key ``%010d``, a 16-byte header
    ``<iIIHH`` label, height, width, channels, then planar pixels)."""
    value = txn.get(b"%010d" % index)
    label, height, width, channels, _ = struct.unpack_from("<iIIHH", value)
    return np.frombuffer(value, np.uint8, offset=16).reshape(channels, height, width), label


def test_lmdb_batches_match_the_file_read_with_lmdb(tmp_path, lmdb_32):
    """The LMDB batch path (one flat row copy per value) against lmdb reading the file directly
    (a copy: lmdb opens a file once per process, and the fixture's may be open)."""
    path = tmp_path / "copy.lmdb"
    shutil.copytree(lmdb_32, path)
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True)
    with env.begin() as txn:
        expected = [_lmdb_sample(txn, i) for i in range(18)]  # bytes values: valid after the transaction
    env.close()
    loader = Loader(LMDBDataset(path), 5, shuffle=True, seed=3, threads=2)
    got = []
    for (images, labels), indices in zip(loader, loader.batch_indices()):
        for j, i in enumerate(indices.tolist()):
            pixels, label = expected[i]
            assert np.array_equal(images[j].numpy(), pixels) and int(labels[j]) == label
            got.append(i)
    assert sorted(got) == list(range(18))


def test_lmdb_sample_of_another_shape_is_refused(tmp_path, lmdb_32):
    """A value whose header gives another shape of the same byte count (1x96x32 for 3x32x32)."""
    dst = tmp_path / "reshaped.lmdb"
    shutil.copytree(lmdb_32, dst)
    env = lmdb.open(str(dst), subdir=True)
    with env.begin(write=True) as txn:
        value = bytearray(txn.get(b"%010d" % 5))
        label = struct.unpack_from("<i", value)[0]
        struct.pack_into("<iIIHH", value, 0, label, 96, 32, 1, 0)
        txn.put(b"%010d" % 5, bytes(value))
    env.close()
    with pytest.raises(PackedFormatError, match=r"sample 5 is 1x96x32, expected 3x32x32"):
        for _ in Loader(LMDBDataset(dst), 4, shuffle=False):
            pass


# -- buffers ---------------------------------------------------------------------------------
def test_buffers_are_reused_not_reallocated(ds):
    loader = Loader(ds, 2, threads=1, prefetch=2)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for images, labels in loader:
            pass
    assert loader.buffers_allocated <= loader.prefetch + 2
    assert loader.buffer_bytes == loader.buffers_allocated * (2 * 3 * 32 * 32 + 2 * 8)


def test_checked_buffers_never_overwrite_a_kept_batch(ds):
    """Default: keeping batches (or views of them) is safe; their buffers are simply not reused."""
    loader = Loader(ds, 2, shuffle=False, threads=2, prefetch=1)
    kept = [(images[1:], labels.numpy()) for images, labels in loader]  # views and numpy arrays only
    for k, (images, labels) in enumerate(kept):
        assert torch.equal(images[0], ds[2 * k + 1][0])
        assert labels.tolist() == [ds[2 * k][1], ds[2 * k + 1][1]]
    assert loader.buffers_allocated == 9
    del kept
    # released batches make their buffers reusable again: a new epoch allocates nothing
    before = loader.buffers_allocated
    for _ in loader:
        pass
    assert loader.buffers_allocated == before


def test_recycle_contract(ds):
    """``recycle``: a batch is valid until the batch after next is requested, then reused."""
    loader = Loader(ds, 2, shuffle=False, threads=1, prefetch=1, buffers="recycle")
    it = iter(loader)
    first, _ = next(it)
    snapshot = first.clone()
    second, _ = next(it)
    assert torch.equal(first, snapshot)  # still valid while the next batch is in use
    for _ in it:
        pass
    assert loader.buffers_allocated == 2  # prefetch + the batch in use
    assert not torch.equal(first, snapshot)  # by contract: overwritten later


def test_fresh_buffers(ds):
    loader = Loader(ds, 2, shuffle=False, buffers="fresh")
    batches = [images for images, _ in loader]
    assert loader.buffers_allocated == 9
    assert all(torch.equal(b[0], ds[2 * k][0]) for k, b in enumerate(batches))


# -- devices ---------------------------------------------------------------------------------
def test_device_cpu(ds):
    images, labels = next(iter(Loader(ds, 4, device="cpu", shuffle=False)))
    assert images.device.type == "cpu" and torch.equal(images[0], ds[0][0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error(ds):
    with pytest.raises(ValueError, match="CUDA is not available"):
        Loader(ds, 4, device="cuda")


def test_gather_option_is_checked(ds):
    with pytest.raises(ValueError, match="choose from auto, host, device"):
        Loader(ds, 4, gather="gpu")
    with pytest.raises(ValueError, match="gather='device' needs a CUDA device"):
        Loader(ds, 4, gather="device")
    assert Loader(ds, 4).gather == "host"


def test_cuda_prefetcher_on_cpu_passes_batches_through(ds):
    plain = DataLoader(ds, batch_size=4)
    prefetched = list(CUDAPrefetcher(plain, "cpu"))
    assert len(prefetched) == len(CUDAPrefetcher(plain, "cpu")) == 5
    for (a, la), (b, lb) in zip(prefetched, plain):
        assert torch.equal(a, b) and torch.equal(la, lb)
    loader = Loader(ds, 4, shuffle=False)
    assert sum(len(x) for x, _ in CUDAPrefetcher(loader, device="cpu")) == 18


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("buffers", ["checked", "recycle"])
def test_cuda_loader_and_prefetcher(ds, buffers):
    loader = Loader(ds, 4, device="cuda", seed=2, buffers=buffers)
    for epoch in range(2):
        loader.set_epoch(epoch)
        for (images, labels), indices in zip(loader, loader.batch_indices()):
            assert images.is_cuda and labels.is_cuda
            want = torch.stack([ds[int(i)][0] for i in indices])
            assert torch.equal(images.cpu(), want)
    assert loader.buffers_allocated <= loader.prefetch + 2
    for (a, la), (b, lb) in zip(CUDAPrefetcher(DataLoader(ds, batch_size=4)), DataLoader(ds, batch_size=4)):
        assert a.is_cuda and torch.equal(a.cpu(), b) and torch.equal(la.cpu(), lb)


def test_device_gather_of_a_verified_blob_names_verify(packed_32):
    """gather='device' over a blob opened with verify=True says that verify is why, and what to do
    (the gather would bypass the per-sample checks); the check runs on the CPU."""
    from readers import RAMDataset
    from readers.device_gather import DeviceGatherUnavailable, host_arrays

    with pytest.raises(DeviceGatherUnavailable, match="opened with verify=True.*verify=False.*gather='host'"):
        host_arrays(RAMDataset(packed_32("blob"), verify=True), in_memory_only=False)
    images, labels = host_arrays(RAMDataset(packed_32("blob"), verify=False), in_memory_only=False)
    assert images.shape == (18, 3, 32, 32) and labels.shape == (18,)


# -- indices (a subset of one file) --------------------------------------------------------------
def test_indices_read_exactly_that_subset_every_way(ds):
    """``indices=`` (FFCV's): each epoch is a permutation of the subset (repeats kept), split
    between ranks, through the batch path; pixels and labels are the dataset's own."""
    subset = [17, 3, 3, 8, 0, 11, 5]
    loader = Loader(ds, 3, seed=2, indices=subset, threads=2)
    assert len(loader) == 3 and "indices=<7>" in repr(loader)
    got = []
    for images, labels in loader:
        for image, label in zip(images, labels):
            got.append(next(i for i in set(subset) if torch.equal(ds[i][0], image) and ds[i][1] == int(label)))
    assert sorted(got) == sorted(subset) and got != subset  # shuffled, 3 twice
    assert sorted(seen(loader, 1)) == sorted(subset) and seen(loader, 1) != seen(loader, 0)
    unshuffled = Loader(ds, 3, shuffle=False, indices=np.array(subset))
    assert seen(unshuffled) == subset
    ranks = [Loader(ds, 2, seed=2, indices=subset, rank=r, world_size=2, drop_last=True) for r in range(2)]
    parts = [seen(r) for r in ranks]
    assert len(parts[0]) == len(parts[1]) == 2 and all(i in subset for part in parts for i in part)


def test_indices_resume_only_over_the_same_indices(ds):
    subset = list(range(0, 18, 2))
    first = Loader(ds, 2, seed=4, indices=subset)
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    first.close()
    resumed = Loader(ds, 2, seed=4, indices=subset)
    resumed.load_state_dict(state)
    assert len(resumed) == 3  # the rest: 5 of 9, in batches of 2
    other = Loader(ds, 2, seed=4, indices=list(range(1, 18, 2)))  # as many samples, others
    with pytest.raises(ResumeError, match=r"saved over the indices [0-9a-f]{16}, this loader reads the indices [0-9a-f]{16}"):
        other.load_state_dict(state)
    with pytest.raises(ResumeError, match="saved over the indices .*, this loader reads the whole dataset"):
        Loader(ds, 2, seed=4).load_state_dict(state)
    with pytest.raises(ResumeError, match="saved over the whole dataset, this loader reads the indices"):
        Loader(ds, 2, seed=4, indices=subset).load_state_dict(Loader(ds, 2, seed=4).state_dict())


@pytest.mark.parametrize("indices, message", [
    ([0, 18], r"indices\[1\] = 18 is outside the dataset's 0\.\.17$"),
    ([-1, 2, 99], r"indices\[0\] = -1 is outside the dataset's 0\.\.17 \(2 such indices\)$"),
    ([], "indices is empty, so every epoch would yield no batch"),
    ([0.5, 1.0], "indices must be a 1-D sequence of integer dataset indices, got float64"),
    ([[0, 1]], r"indices must be a 1-D sequence of integer dataset indices, got int64 of shape \(1, 2\)"),
    ([True] * 18, r"indices is a boolean mask: pass the indices it selects, numpy\.flatnonzero\(mask\)"),
])
def test_bad_indices_are_one_line(ds, indices, message):
    with pytest.raises(ValueError, match="^Loader: " + message):
        Loader(ds, 4, indices=indices)


@pytest.mark.parametrize("fmt", FORMATS)
def test_read_batch_refuses_indices_that_are_not_integers(packed_32, fmt):
    """``read_batch([1.7])`` read sample 1 and a boolean mask samples 0 and 1, where ``ds[1.7]`` raises."""
    ds = packed_dataset(packed_32, fmt)
    with pytest.raises(TypeError, match=r"^indices must be integers, got float64 \(1\.7 first\)$"):
        ds.read_batch([1.7])
    with pytest.raises(TypeError, match=r"^indices must be integers, got bool \(True first\)$"):
        ds.read_batch(np.array([True, False]))
    assert torch.equal(ds.read_batch(np.array([2], np.uint8))[0][0], ds[2][0])


def test_a_counted_loop_after_a_resume_reads_whole_epochs_after_the_rest(ds):
    """``for epoch ...: for batch in zip(range(len(loader)), loader)`` after a resume: the rest
    of the resumed epoch, then whole epochs (len() kept the rest's count after its last batch, so
    the next epoch was cut short, then read again)."""
    first = Loader(ds, 4, seed=2, threads=1)
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    first.close()
    loader = Loader(ds, 4, seed=2, threads=1)
    loader.load_state_dict(state)
    counts = []
    for _epoch in range(3):
        counts.append(len([batch for _, batch in zip(range(len(loader)), loader)]))
    assert counts == [3, 5, 5] and loader.epoch == 3  # 10 of 18 left: 3 batches; then 5 a whole epoch


def test_indices_of_a_dataset_of_another_length_do_not_resume():
    """With ``indices=`` the count in the fingerprint is the subset's: a plain dataset of 30 and one
    of 100 (no metadata to tell them apart) read through range(10) are told apart by the digest."""
    def tensors(n):
        return torch.utils.data.TensorDataset(torch.zeros(n, 1, 1, 1, dtype=torch.uint8), torch.arange(n))

    state = Loader(tensors(30), 2, indices=range(10)).state_dict()
    Loader(tensors(30), 2, indices=range(10)).load_state_dict(state)
    with pytest.raises(ResumeError, match="saved over the indices"):
        Loader(tensors(100), 2, indices=range(10)).load_state_dict(state)


def test_a_state_saved_at_an_epochs_last_step_resumes_with_the_next_epoch(ds):
    """A checkpoint every step: the one after an epoch's last batch said {epoch e, all consumed},
    so a resumed plain loop ran an empty epoch first (and disagreed with len()). It says the next
    epoch now, as len() does."""
    loader = Loader(ds, 4, seed=6, threads=1)
    states = [loader.state_dict() for _batch in loader]
    assert [s["samples_consumed"] for s in states] == [4, 8, 12, 16, 0] and states[-1]["epoch"] == 1
    resumed = Loader(ds, 4, seed=6, threads=1)
    resumed.load_state_dict(states[-1])
    assert len(resumed) == 5 and resumed.batch_indices()[0].tolist() == loader.batch_indices(1)[0].tolist()


def test_a_loop_that_breaks_off_each_pass_is_warned_of_once(ds):
    """A fixed number of steps per epoch (``if i == 2: break``) began the same epoch at its first
    batch every time, so training saw the same few batches, and nothing said so (an FFCV user's
    walkthrough: FFCV moves on at every iteration). The third such start warns, once; a look at
    one batch before whole passes, and passes that choose their epoch, do not."""
    import warnings

    def steps(loader: Loader, n: int) -> list[int]:
        taken = []
        for i, (_images, labels) in enumerate(loader):
            taken += labels.tolist()
            if i == n - 1:
                break
        return taken

    loader = Loader(ds, 4, seed=3, threads=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        orders = [steps(loader, 2) for _ in range(5)]
    assert orders == [orders[0]] * 5 and loader.epoch == 0
    said = [str(w.message) for w in caught if "begins again" in str(w.message)]
    assert said == ["Loader: epoch 0 begins again at its first batch, a third time: the passes before stopped after 2 of 5 "
                    "batches, and only a pass that hands out every batch moves on to the next epoch, so each reads the same "
                    "first batches; call loader.set_epoch(epoch) before each epoch (as with DistributedSampler), or keep one "
                    "iterator and draw from it"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        looked = Loader(ds, 4, seed=3, threads=2)
        steps(looked, 1)  # a look at one batch, then whole passes
        for _ in range(3):
            list(looked)
        chosen = Loader(ds, 4, seed=3, threads=2)
        for _ in range(4):
            chosen.set_epoch(0)  # the same epoch, chosen each time: asked for
            steps(chosen, 2)


def test_a_resumable_sampler_repeating_a_shuffled_epoch_says_so(ds):
    """Without set_epoch, every DataLoader pass over a ResumableSampler follows epoch 0's order
    (as DistributedSampler's), and nothing said so (StreamingShards warns of it)."""
    import warnings

    from torch.utils.data import DataLoader

    from readers import ResumableSampler

    sampler = ResumableSampler(ds, 4, shuffle=True, seed=1)
    loader = DataLoader(ds, batch_size=4, sampler=sampler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        orders = [[label for _images, labels in loader for label in labels.tolist()] for _ in range(4)]
    assert orders == [orders[0]] * 4
    assert [str(w.message) for w in caught] == ["ResumableSampler: epoch 0's order a third time: no set_epoch between its iterations, "
                                                "so each repeats it; call sampler.set_epoch(epoch) before each epoch, as with "
                                                "DistributedSampler"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = ResumableSampler(ds, 4, shuffle=True, seed=1)
        for _ in range(3):  # the same epoch, chosen each time: asked for
            chosen.set_epoch(0)
            list(DataLoader(ds, batch_size=4, sampler=chosen))
        unshuffled = ResumableSampler(ds, 4, shuffle=False)
        list(unshuffled), list(unshuffled), list(unshuffled)  # (the same order is the order asked for)
        looked = ResumableSampler(ds, 4, shuffle=True, seed=1)
        list(looked), list(DataLoader(ds, batch_size=4, sampler=looked))  # a look at the order, then the epoch
