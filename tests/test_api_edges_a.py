"""Edges of the Python API found by a walkthrough: quiet interpreter exit, Normalize under a
model's ``.to(dtype)``, non-tensor input, and empty batches in every format."""

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import readers
from packer import ImageOptions, convert
from readers import Normalize, RandomHorizontalFlip, RandomResizedCrop
from readers.gpu import IMAGENET_MEAN, IMAGENET_STD

from conftest import SUFFIX

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ["blob", "lmdb", "hdf5", "webdataset"]


# -- 1. nothing printed at interpreter exit ----------------------------------------------------

def run_script(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("fmt", ["blob", "hdf5"])  # the blob's in-memory copy was the one; HDF5 for its library's own exit (4 s of suite time saved)
def test_module_level_loader_exits_quietly(fmt, packed_32, tmp_path):
    """A script holding a dataset and a Loader in module globals: finalisers run while the
    interpreter tears modules down, and must print nothing (MemoryCopy.__del__ once found ``os``
    gone: 'Exception ignored in ... AttributeError: 'NoneType' object has no attribute 'close'')."""
    opener = "readers.RAMDataset" if fmt == "blob" else "readers.open_dataset"
    proc = run_script(
        f"""
        import readers
        ds = {opener}({str(packed_32(fmt))!r})
        loader = readers.Loader(ds, 4)
        batch = next(iter(loader))
        assert batch[0].shape == (4, 3, 32, 32), batch[0].shape
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawned_worker_with_shared_blob_exits_quietly(packed_32, tmp_path, method):
    """A spawned worker is sent the dataset the way a spawned DataLoader worker is (a Process
    argument, pickled by ForkingPickler): it maps the parent's in-memory blob through the sent
    descriptor, reads a batch, and exits through a normal interpreter shutdown printing nothing.

    The dataset is made at the script's module level, which the child runs again: that one must
    not load a copy of its own there (N workers, N copies of the file), so the child's only
    memfd is its parent's (the same inode). A dataset the child makes in its own work (a DDP
    rank started by ``mp.spawn``, say) still loads at once; and the module-level one loads just
    before the child forks, so its forked workers share that copy instead of loading one each.

    A Process and a Pipe, not a DataLoader: torch's worker shutdown has noise of its own on a
    loaded machine (a worker aborting when its queue's feeder thread is still pickling a
    prefetched batch at exit, "terminate called without an active exception"; a resource_tracker
    "leaked semaphore" warning for the loader's queues), which failed this test in CI. DataLoader
    workers under spawn are read through in tests/test_datasets.py::test_dataloader_workers."""
    proc = run_script(
        f"""
        import multiprocessing, os, shutil
        import torch
        import readers

        def memfd_inodes():
            inodes = set()
            for fd in os.listdir("/proc/self/fd"):
                try:  # the listing's own descriptor is gone by now
                    if os.readlink(f"/proc/self/fd/{{fd}}").startswith("/memfd:packer-blob"):
                        inodes.add(os.stat(f"/proc/self/fd/{{fd}}").st_ino)
                except FileNotFoundError:
                    pass
            return inodes

        def batch(ds):
            return torch.stack([ds[i][0] for i in range(4)])

        def grandchild(conn):
            ds[0]  # the module-level dataset, loaded by its parent just before the fork
            conn.send(memfd_inodes())

        def worker(sent_ds, conn):
            images = batch(sent_ds)
            sent = memfd_inodes()
            fork = multiprocessing.get_context("fork")  # a rank's DataLoader forking its workers
            mine, theirs = fork.Pipe()
            process = fork.Process(target=grandchild, args=(theirs,))
            process.start()
            theirs.close()
            inherited = mine.recv()
            process.join()
            after = memfd_inodes()
            own = readers.RAMDataset(sent_ds.path)  # made in the child's own work: the same file, that copy
            made = memfd_inodes() - sent
            other = shutil.copy(sent_ds.path, str(sent_ds.path) + ".copy.blob")
            before = memfd_inodes()
            kept = readers.RAMDataset(other)  # another file, made in the child's own work: loaded at once, before any read
            loaded = memfd_inodes() - before
            conn.send((tuple(images.shape), images.sum().item(), sent, made, after - sent, inherited == after, len(loaded)))

        ds = readers.RAMDataset({str(packed_32("blob"))!r})  # made again in the child
        if __name__ == "__main__":
            ctx = multiprocessing.get_context({method!r})
            mine, theirs = ctx.Pipe()
            process = ctx.Process(target=worker, args=(ds, theirs))
            process.start()
            theirs.close()  # a worker that dies ends recv() with EOFError instead of a hang
            shape, total, sent, own, at_fork, shared, loaded = mine.recv()
            process.join()
            assert process.exitcode == 0, process.exitcode
            assert shape == (4, 3, 32, 32), shape
            assert total == batch(ds).sum().item()
            assert sent and sent == memfd_inodes(), (sent, memfd_inodes())  # the parent's copy, no other
            assert len(at_fork) == 1 and shared, (at_fork, shared)  # loaded once, before the fork: one copy for its workers
            assert own == at_fork, (own, at_fork)  # a dataset made in the child's own work shares it
            assert loaded == 1, loaded
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def memfds() -> list[str]:
    """This process's open in-memory blob copies (their /proc/self/fd links)."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, gone already
            pass
    return [link for link in links if "packer-blob:" in link]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="in-memory blobs are Linux memfds")
def test_in_memory_copy_is_closed_when_the_dataset_goes(packed_32):
    """The memfd lives while a dataset does and is closed when the last one is collected."""
    gc.collect()
    before = memfds()
    ds = readers.RAMDataset(packed_32("blob"))
    image, _ = ds[0]
    assert image.shape == (3, 32, 32)
    assert len(memfds()) > len(before)  # the memfd (and its map's duplicate)
    del ds, image
    gc.collect()
    assert memfds() == before


# -- 2. Normalize follows the model's dtype ----------------------------------------------------

@pytest.fixture
def batch():
    return torch.randint(0, 256, (4, 3, 17, 19), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def torch_reference(images: torch.Tensor) -> torch.Tensor:
    """The normalisation written out in plain torch, float32."""
    mean = torch.tensor(IMAGENET_MEAN).reshape(-1, 1, 1)
    std = torch.tensor(IMAGENET_STD).reshape(-1, 1, 1)
    return (images.float() / 255 - mean) / std


@pytest.mark.parametrize(
    "cast, dtype",
    [
        (lambda m: m.to(torch.bfloat16), torch.bfloat16),
        (lambda m: m.bfloat16(), torch.bfloat16),
        (lambda m: m.half(), torch.float16),
        (lambda m: m.to(torch.float16), torch.float16),
    ],
)
def test_module_cast_sets_the_output_dtype(batch, cast, dtype):
    module = cast(Normalize())
    out = module(batch)
    assert out.dtype == dtype
    torch.testing.assert_close(out, torch_reference(batch).to(dtype))  # torch's tolerance for the dtype
    # rounded once from float32 constants: the same as asking for the dtype up front
    assert torch.equal(out, Normalize(dtype=dtype)(batch))
    assert module.scale.dtype == module.shift.dtype == torch.float32


def test_bfloat16_model_runs_on_uint8_batches(batch):
    """The walkthrough's model: before, 'Input type (float) and bias type (c10::BFloat16) should be the same'."""
    torch.manual_seed(0)
    model = nn.Sequential(Normalize(), nn.Conv2d(3, 4, 3)).to(torch.bfloat16)
    out = model(batch)
    assert out.dtype == torch.bfloat16 and out.shape == (4, 4, 15, 17)
    assert torch.equal(out, model[1](torch_reference(batch).to(torch.bfloat16)))


def test_float_and_double_casts_follow_too(batch):
    back = Normalize(dtype=torch.bfloat16).float()
    assert back(batch).dtype == torch.float32
    assert torch.equal(back(batch), Normalize()(batch))
    double = Normalize().double()
    out = double(batch)
    assert out.dtype == torch.float64
    exact = (batch.double() / 255 - torch.tensor(IMAGENET_MEAN, dtype=torch.float64).reshape(-1, 1, 1)) / torch.tensor(
        IMAGENET_STD, dtype=torch.float64
    ).reshape(-1, 1, 1)
    assert (out - exact).abs().max().item() < 1e-6  # float32-exact constants, float64 arithmetic
    assert torch.equal(Normalize(dtype=torch.float64).half()(batch), Normalize(dtype=torch.float16)(batch))


def test_device_moves_keep_the_dtype(batch):
    module = Normalize(dtype=torch.bfloat16).to("meta")
    assert module.scale.device.type == "meta" and module.dtype == torch.bfloat16
    assert module(batch.to("meta")).dtype == torch.bfloat16
    both = Normalize().to("meta", torch.float16)  # a move and a cast in one call
    assert both.scale.device.type == "meta" and both.scale.dtype == torch.float32
    assert both(batch.to("meta")).dtype == torch.float16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cast_and_move_together_on_cuda(batch):
    module = Normalize().to("cuda", torch.bfloat16)
    assert module.scale.is_cuda and module.scale.dtype == torch.float32
    out = module(batch.cuda())
    assert out.is_cuda and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), torch_reference(batch).to(torch.bfloat16))


def test_state_dict_of_a_cast_module_loads_anywhere(batch):
    cast = Normalize(mean=[0.1, 0.2, 0.3], std=[0.5, 0.25, 0.125]).bfloat16()
    fresh = Normalize(dtype=torch.bfloat16)
    fresh.load_state_dict(cast.state_dict())
    assert torch.equal(fresh(batch), cast(batch))


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch without float8")
def test_a_cast_to_a_dtype_it_cannot_produce_is_refused(batch):
    module = Normalize()
    with pytest.raises(ValueError, match=r"^Normalize: dtype must be a floating dtype \(float32, float16, bfloat16, float64\), got torch.float8_e4m3fn$"):
        module.to(torch.float8_e4m3fn)
    assert module.dtype == module.scale.dtype == torch.float32  # untouched
    assert torch.equal(module(batch), Normalize()(batch))


def test_augmentations_follow_their_input_in_a_cast_model(batch):
    """The sibling modules hold no constants: in a bfloat16 model they keep their input's dtype."""
    model = nn.Sequential(RandomResizedCrop(8, generator=0), Normalize(), RandomHorizontalFlip(generator=0)).to(torch.bfloat16)
    assert model(batch).dtype == torch.bfloat16
    model = nn.Sequential(Normalize(), RandomResizedCrop(8, generator=0)).half()
    assert model(batch).dtype == torch.float16


def test_cast_module_compiles_as_one_graph(batch):
    module = Normalize().bfloat16()
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    assert torch.equal(compiled(batch), Normalize(dtype=torch.bfloat16)(batch))


# -- 3. non-tensor input names what it got -----------------------------------------------------

@pytest.mark.parametrize(
    "module, wants",
    [(Normalize(), "a torch uint8 tensor"), (RandomResizedCrop(8), "a torch tensor"), (RandomHorizontalFlip(), "a torch tensor")],
    ids=["Normalize", "RandomResizedCrop", "RandomHorizontalFlip"],
)
def test_non_tensors_are_named(batch, module, wants):
    who = type(module).__name__
    with pytest.raises(TypeError) as info:
        module(batch.numpy())
    assert str(info.value) == f"{who} expects {wants}, got a numpy array: convert it with torch.from_numpy(array)"
    with pytest.raises(TypeError) as info:
        module(batch.tolist())
    assert str(info.value) == f"{who} expects {wants}, got list"


def test_wrong_tensor_dtype_still_names_the_dtype():
    with pytest.raises(TypeError, match=r"^Normalize expects uint8 images, got torch.float32: give it the batch as read \(it scales by 1/255 itself\); images already float"):
        Normalize()(torch.zeros(3, 4, 4))


# -- 4. an empty batch from every format -------------------------------------------------------

@pytest.fixture(scope="module")
def jpeg_32(image_folder, tmp_path_factory):
    made = {}

    def get(fmt: str) -> Path:
        if fmt not in made:
            dst = tmp_path_factory.mktemp(f"{fmt}-jpeg") / f"data{SUFFIX[fmt]}"
            convert(image_folder, dst, format=fmt, image=ImageOptions(size=32, encoding="jpeg"), workers=1)
            made[fmt] = dst
        return made[fmt]

    return get


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_every_format_reads_an_empty_batch_alike(packed_32, jpeg_32, encoding):
    results = {}
    for fmt in FORMATS:
        ds = readers.open_dataset((packed_32 if encoding == "raw" else jpeg_32)(fmt))
        images, labels = ds.read_batch([])
        given, given_labels = ds.read_batch([], out=np.empty((0, 3, 32, 32), np.uint8))
        assert torch.equal(given, images) and torch.equal(given_labels, labels)
        results[fmt] = (type(images), images.dtype, tuple(images.shape), type(labels), labels.dtype, tuple(labels.shape))
        assert ds.__getitems__([]) == []
    expected = (torch.Tensor, torch.uint8, (0, 3, 32, 32), torch.Tensor, torch.int64, (0,))
    assert results == dict.fromkeys(FORMATS, expected)


def test_batch_modules_take_an_empty_batch():
    """An empty batch (a last partial batch filtered to nothing) goes through every module, shaped."""
    empty = torch.zeros(0, 3, 8, 8, dtype=torch.uint8)
    assert RandomResizedCrop(4, generator=0)(empty).shape == (0, 3, 4, 4)
    assert RandomResizedCrop(4, generator=0)(empty.float()).dtype == torch.float32
    assert Normalize()(empty).shape == (0, 3, 8, 8) and RandomHorizontalFlip(generator=0)(empty).shape == (0, 3, 8, 8)
