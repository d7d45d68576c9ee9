"""The RAM-resident blob: its documented layout, unfinished and damaged files, and memory sharing."""

import pickle
import re
import shutil
from multiprocessing import resource_sharer
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DataLoader

from imagefiles import gradient, jpeg_bytes, write
from packer import ImageOptions, convert
from packer.cli import cli
from packer.preprocess.task import Encoded
from packer.writers.blob import BlobWriter
from readers import IncompleteDatasetError, PackedFormatError, RAMDataset, UnsupportedVersionError
from readers.formats import open_store
from readers.formats.blob import HEADER, BlobStore

DOCS = Path(__file__).resolve().parents[1] / "docs" / "FORMATS.md"


def documented_reader() -> str:
    """The plain-numpy example of docs/FORMATS.md's blob section."""
    section = DOCS.read_text().split("## RAM-resident blob", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def read_as_documented(path: Path, i: int) -> tuple[np.ndarray, int]:
    code = documented_reader().replace('path, i = "train.blob", 42', f"path, i = {str(path)!r}, {i}")
    scope: dict = {}
    exec(compile(code, "FORMATS.md", "exec"), scope)
    pixels = np.asarray(scope["pixels"])
    if pixels.ndim == 2:  # a decoded grayscale file
        pixels = pixels[np.newaxis]
    elif pixels.shape[-1] == 3 and scope["meta"]["encoding"] != "raw":  # a decoded RGB file: (H, W, C)
        pixels = pixels.transpose(2, 0, 1)
    return pixels, scope["label"]


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("mixed")
    for name, (h, w) in {"a/wide.jpg": (40, 60), "a/tall.jpg": (60, 40), "b/square.jpg": (50, 50)}.items():
        write(src / name, jpeg_bytes(gradient(h, w)))
    return src


def test_plain_numpy_reading_as_documented(packed_32):
    path = packed_32("blob")
    store = BlobStore(path)
    for i in (0, 7, 17):
        pixels, label = read_as_documented(path, i)
        want, want_label = store.read(i)
        assert np.array_equal(pixels, want) and label == want_label


@pytest.mark.parametrize("image", [dict(size=24, resize_mode="shorter"), dict(size=24, encoding="png"), dict(size=24, encoding="jpeg", grayscale=True)])
def test_variable_shapes_and_encodings(tmp_path, mixed_folder, image):
    dst = tmp_path / "mixed.blob"
    convert(mixed_folder, dst, image=ImageOptions(**image), workers=1)
    ds = RAMDataset(dst)
    assert ds.meta.encoding == image.get("encoding", "raw")
    for i in range(3):
        pixels, label = read_as_documented(dst, i)
        image_i, label_i = ds[i]
        assert np.array_equal(pixels, image_i.numpy()) and label == label_i
    if ds.meta.fixed_shape:
        assert torch.equal(ds.read_batch([2, 0])[0][1], ds[0][0])


def test_sections_are_aligned_and_fixed_raw_is_one_array(packed_32):
    store = BlobStore(packed_32("blob"))
    assert all(offset % 4096 == 0 for offset, _ in store.header.sections.values())
    assert store.header.sections["offsets"][1] == store.header.sections["shapes"][1] == 0
    images = np.memmap(store.path, np.uint8, mode="r", offset=store.header.sections["data"][0], shape=(18, 3, 32, 32))
    assert np.array_equal(images[5], store.read(5)[0])


def copy_with(src: Path, dst: Path, offset: int, data: bytes) -> Path:
    shutil.copy(src, dst)
    with open(dst, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)
    return dst


def test_missing_header_truncation_and_foreign_files(tmp_path, packed_32):
    path = packed_32("blob")
    with pytest.raises(IncompleteDatasetError, match="did not finish"):
        RAMDataset(copy_with(path, tmp_path / "nohead.blob", 0, bytes(HEADER.size)))
    cut = tmp_path / "cut.blob"
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(IncompleteDatasetError, match="truncated"):
        open_store(cut)
    with pytest.raises(PackedFormatError, match="not a packer blob"):
        RAMDataset(copy_with(path, tmp_path / "other.blob", 0, b"NOTABLOB"))
    (tmp_path / "empty.blob").write_bytes(b"")
    with pytest.raises(IncompleteDatasetError, match="did not finish"):
        open_store(tmp_path / "empty.blob")


def test_newer_versions_are_refused(tmp_path, packed_32):
    path = packed_32("blob")
    data = path.read_bytes()
    assert data.count(b'"format_version": 1') == 1
    (tmp_path / "meta.blob").write_bytes(data.replace(b'"format_version": 1', b'"format_version": 2'))
    with pytest.raises(UnsupportedVersionError, match="update packer"):
        RAMDataset(tmp_path / "meta.blob")
    version = int.from_bytes(data[8:12], "little")
    with pytest.raises(UnsupportedVersionError, match="update packer"):
        BlobStore(copy_with(path, tmp_path / "head.blob", 8, (version + 1).to_bytes(4, "little")))


def test_interrupted_write_leaves_no_destination(tmp_path):
    dst = tmp_path / "out.blob"
    sample = Encoded(1, (3, 4, 4), bytes(range(48)))
    with pytest.raises(KeyboardInterrupt):
        with BlobWriter(dst) as writer:
            writer.add(sample)
            raise KeyboardInterrupt
    assert not dst.exists() and not writer.tmp.exists()
    writer = BlobWriter(dst)  # as a killed conversion leaves it: data written, header still zero
    writer.add(sample)
    writer._file.flush()
    with pytest.raises(IncompleteDatasetError, match="a conversion in progress: packer"):  # (its writer is alive here, holding the lock)
        open_store(writer.tmp)
    shutil.copy(writer.tmp, tmp_path / "renamed.blob")
    with pytest.raises(IncompleteDatasetError, match="did not finish"):
        open_store(tmp_path / "renamed.blob")
    writer.abort()
    assert not writer.tmp.exists()


def test_cli_convert_then_info(tmp_path, image_folder):
    dst = tmp_path / "out.blob"
    runner = CliRunner()
    result = runner.invoke(cli, ["convert", str(image_folder), str(dst), "--size", "16", "-j", "1", "-q"])
    assert result.exit_code == 0, result.output
    info = runner.invoke(cli, ["info", str(dst)])
    assert info.exit_code == 0, info.output
    assert "blob, format version 1" in info.stdout and "samples    18" in info.stdout
    assert RAMDataset(dst)[17][0].shape == (3, 16, 16)


@pytest.mark.parametrize("in_memory", [True, False])
def test_pickling_sends_no_pixels(packed_32, in_memory):
    path = packed_32("blob")
    ds = RAMDataset(path, in_memory=in_memory)
    assert path.stat().st_size > 18 * 3 * 32 * 32
    try:
        for forking, dumps, loads in ((False, pickle.dumps, pickle.loads), (True, ForkingPickler.dumps, ForkingPickler.loads)):
            data = bytes(dumps(ds))  # ForkingPickler: what a spawned DataLoader worker is sent
            assert len(data) < 5_000 and ds[3][0].numpy().tobytes()[:64] not in data
            assert (b"_attach" in data) == (in_memory and forking)  # a descriptor, not a reload
            clone = loads(data)
            assert torch.equal(clone[4][0], ds[4][0]) and clone.in_memory == in_memory
    finally:
        resource_sharer.stop()  # the thread that handed the descriptor over (outside a spawn)


def test_datasets_over_one_file_share_one_copy(packed_32):
    path = packed_32("blob")
    a, b = RAMDataset(path), RAMDataset(path)
    buffers = [ds.store._view.get().data for ds in (a, b)]
    assert np.shares_memory(*buffers) and not buffers[0].flags.writeable


def test_mapped_dataset_under_forked_workers(packed_32):
    ds = RAMDataset(packed_32("blob"), in_memory=False)
    want = torch.stack([ds[i][0] for i in range(len(ds))])
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    assert torch.equal(torch.cat([x for x, _ in loader]), want)


def test_a_blob_larger_than_the_memory_available_is_one_line_before_loading(image_folder, tmp_path, monkeypatch):
    """RAMDataset loaded a blob whatever its size: under a memory limit a traceback ending in
    'OSError: [Errno 12] Cannot allocate memory', on a real node the OOM killer (an FFCV user's
    walkthrough). Now a blob larger than the memory available is refused before any of it is
    loaded, and one the kernel will not take is one line too; mapped, it still reads."""
    import errno
    import os

    import readers.formats.blob_memory as blob  # (the shared-memory copy, where the memory is checked)

    dst = convert(image_folder, tmp_path / "d.blob", image=ImageOptions(size=16), workers=1).dst
    size = os.path.getsize(dst)
    monkeypatch.setattr(blob, "available_memory", lambda: size - 1)
    said = f"{size / 1e6:,.1f} MB, more than the {(size - 1) / 1e6:,.1f} MB"
    with pytest.raises(PackedFormatError, match=rf"^{dst}: cannot be read from memory: {said} of memory this "
                                                r"machine has available; read it mapped, RAMDataset\(path, in_memory=False\)"):
        RAMDataset(dst)
    assert RAMDataset(dst, in_memory=False)[0][0].shape == (3, 16, 16)
    monkeypatch.setattr(blob, "available_memory", lambda: None)

    def refused(*args):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(os, "ftruncate", refused)
    with pytest.raises(PackedFormatError, match=r"cannot be read from memory: no memory to load it into \(Cannot allocate memory\)"):
        RAMDataset(dst)
    monkeypatch.undo()
    assert RAMDataset(dst)[0][0].shape == (3, 16, 16)
