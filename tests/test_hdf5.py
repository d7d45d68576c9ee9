"""HDF5 specifics: the documented layout read with plain h5py, compression, both layouts,
refused and corrupt files, the CLI, and interrupted writes."""

import json
import multiprocessing
import os
import re
import shutil
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from imagefiles import gradient, jpeg_bytes, write

from packer import ImageOptions, convert
from packer.cli import cli
from packer.errors import OutputError
from packer.options import StorageOptions
from packer.preprocess.task import Encoded
from packer.writers import hdf5 as hdf5_writer
from packer.writers.hdf5 import HDF5Writer
from readers import HDF5Dataset, IncompleteDatasetError, Metadata, PackedFormatError, UnsupportedVersionError
from readers.formats import detect_format, open_store
from readers.formats import hdf5_rows
from readers.formats.hdf5 import CHECKSUMS, IMAGES, LABELS, META_ATTR, OFFSETS, PAYLOAD, SHAPES, SOURCES
from readers.loader import default_threads

DOCS = Path(__file__).resolve().parent.parent / "docs" / "FORMATS.md"


def docs_recipe() -> str:
    """The code block of docs/FORMATS.md, HDF5, "Reading it with plain h5py"."""
    section = DOCS.read_text().split("## HDF5", 1)[1].split("\n## ", 1)[0]
    block = section.split("### Reading it with plain h5py", 1)[1]
    return re.search(r"```python\n(.*?)```", block, re.S).group(1)


def read_with_plain_h5py(path: Path, i: int) -> tuple[np.ndarray, int, dict]:
    code = docs_recipe().replace('"train.h5"', "path").replace("42:44", "i:i + 2").replace("42", "i")
    scope = {"path": str(path), "i": i}
    exec(code, scope)  # noqa: S102 - the documented recipe, verbatim but for the path and index
    return scope["pixels"], scope["label"], scope["meta"]


def copy_and_edit(src: Path, dst: Path, edit) -> Path:
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        edit(f)
    return dst


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory) -> Path:
    """Six JPEGs of three sizes, in two classes."""
    root = tmp_path_factory.mktemp("mixed")
    for i, (h, w) in enumerate([(40, 60), (60, 40), (50, 50)] * 2):
        write(root / f"c{i % 2}" / f"{i}.jpg", jpeg_bytes(gradient(h, w, seed=i)))
    return root


@pytest.fixture(scope="module")
def shorter_h5(mixed_folder, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("shorter") / "var.h5"
    convert(mixed_folder, dst, image=ImageOptions(size=20, resize_mode="shorter"), workers=1)
    return dst


def test_documented_recipe_reads_what_the_reader_reads(packed_32, shorter_h5):
    for path in (packed_32("hdf5"), shorter_h5):
        ds = HDF5Dataset(path)
        for i in (0, 3, len(ds) - 1):
            pixels, label, meta = read_with_plain_h5py(path, i)
            image, want = ds[i]
            assert np.array_equal(pixels, image.numpy()) and label == want
            assert meta["count"] == len(ds) and meta["format"] == "hdf5"


def test_fixed_layout_on_disk(packed_32):
    path = packed_32("hdf5")
    assert detect_format(path) == "hdf5"
    with h5py.File(path, "r") as f:
        assert set(f) == {IMAGES, LABELS, CHECKSUMS, SOURCES}
        assert f[IMAGES].shape == (18, 3, 32, 32) and f[IMAGES].chunks == (1, 3, 32, 32) and f[IMAGES].compression is None
        assert f[LABELS].dtype == np.int64 and f[LABELS][()].tolist() == [0] * 6 + [1] * 6 + [2] * 6
        assert json.loads(f.attrs[META_ATTR])["extra"] == {"compression": None}


def test_variable_shapes_use_the_flat_layout(shorter_h5):
    with h5py.File(shorter_h5, "r") as f:
        assert set(f) == {PAYLOAD, OFFSETS, SHAPES, LABELS, CHECKSUMS, SOURCES}
        offsets, shapes = f[OFFSETS][()], f[SHAPES][()]
        assert offsets[0] == 0 and offsets[-1] == f[PAYLOAD].shape[0]
        assert np.array_equal(np.diff(offsets), shapes.prod(axis=1))
    ds = HDF5Dataset(shorter_h5)
    assert ds.meta.shape is None
    assert [ds[i][0].shape for i in range(3)] == [(3, 20, 30), (3, 20, 20), (3, 30, 20)]


@pytest.mark.parametrize("compression", ["gzip", "lzf"])
def test_compression_round_trips_and_is_recorded(tmp_path, image_folder, packed_32, compression):
    dst = tmp_path / "c.h5"
    convert(image_folder, dst, image=ImageOptions(size=32), storage=StorageOptions(compression=compression), workers=1)
    store, plain = open_store(dst), open_store(packed_32("hdf5"))
    assert store.meta.extra == {"compression": compression}
    assert store.serial_reads and default_threads(store) == 1  # read through h5py, one thread at a time
    with h5py.File(dst, "r") as f:
        assert f[IMAGES].compression == compression
    assert store.read_batch([])[0].shape == (0, 3, 32, 32)
    indices = [17, 3, 3, 4, 5, 0]  # unsorted, repeated, a run
    assert np.array_equal(store.read_batch(indices)[0], plain.read_batch(indices)[0])
    assert np.array_equal(store.read(9)[0], plain.read(9)[0])


@pytest.mark.parametrize("encoding", ["jpeg", "png"])
def test_encoded_samples_read_back(tmp_path, image_folder, packed_32, encoding):
    dst = tmp_path / "enc.hdf5"
    quality = 95 if encoding == "jpeg" else None  # --quality is refused with other encodings
    convert(image_folder, dst, image=ImageOptions(size=32, encoding=encoding, quality=quality), storage=StorageOptions(compression="gzip"), workers=1)
    ds, plain = HDF5Dataset(dst), HDF5Dataset(packed_32("hdf5"))
    with h5py.File(dst, "r") as f:
        assert PAYLOAD in f and IMAGES not in f
    images, labels = ds.read_batch([2, 16])
    want, want_labels = plain.read_batch([2, 16])
    assert labels.tolist() == want_labels.tolist() and images.shape == (2, 3, 32, 32)
    error = float((images.int() - want.int()).abs().float().mean())
    assert error == 0 if encoding == "png" else error < 6


def test_layout_moves_to_flat_when_a_later_block_breaks_it(tmp_path, mixed_folder, shorter_h5, monkeypatch):
    monkeypatch.setattr(hdf5_writer, "BLOCK_BYTES", 1)  # one block per sample: the first is written as fixed
    dst = tmp_path / "moved.h5"
    convert(mixed_folder, dst, image=ImageOptions(size=20, resize_mode="shorter"), workers=1)
    got, want = open_store(dst), open_store(shorter_h5)
    assert len(got) == 6
    for (a, la), (b, lb) in zip(got.read_samples(range(6)), want.read_samples(range(6))):
        assert np.array_equal(a, b) and la == lb


def test_raw_looking_encoded_samples_end_in_the_flat_layout(tmp_path, monkeypatch):
    monkeypatch.setattr(hdf5_writer, "BLOCK_BYTES", 1)
    writer = HDF5Writer(tmp_path / "w.h5")
    for label in (0, 1):
        writer.add(Encoded(label, (1, 2, 2), b"abcd"))  # as many bytes as raw pixels: written as fixed at first
    writer.finish(Metadata(format="hdf5", count=2, channels=1, shape=(1, 2, 2), encoding="png"))
    with h5py.File(tmp_path / "w.h5", "r") as f:
        assert IMAGES not in f and f[PAYLOAD][()].tobytes() == b"abcdabcd"
        assert f[OFFSETS][()].tolist() == [0, 4, 8] and f[SHAPES][()].tolist() == [[1, 2, 2]] * 2


def test_missing_metadata_means_incomplete(tmp_path, packed_32):
    path = copy_and_edit(packed_32("hdf5"), tmp_path / "nometa.h5", lambda f: f.attrs.__delitem__(META_ATTR))
    with pytest.raises(IncompleteDatasetError, match="did not finish"):
        HDF5Dataset(path)


def test_newer_format_version_is_refused(tmp_path, packed_32):
    def bump(f):
        meta = json.loads(f.attrs[META_ATTR])
        meta["format_version"] += 1
        f.attrs[META_ATTR] = json.dumps(meta)

    path = copy_and_edit(packed_32("hdf5"), tmp_path / "new.h5", bump)
    with pytest.raises(UnsupportedVersionError, match=r"version 2, but this reader understands up to version 1"):
        HDF5Dataset(path)


def test_metadata_that_disagrees_with_the_datasets_is_corrupt(tmp_path, packed_32):
    def recount(f):
        meta = json.loads(f.attrs[META_ATTR])
        meta["count"] += 1
        f.attrs[META_ATTR] = json.dumps(meta)

    path = copy_and_edit(packed_32("hdf5"), tmp_path / "count.h5", recount)
    with pytest.raises(PackedFormatError, match="corrupt"):
        HDF5Dataset(path)


def test_truncated_or_garbage_files_are_packed_format_errors(tmp_path, packed_32):
    data = packed_32("hdf5").read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(PackedFormatError, match="cut.h5"):
        HDF5Dataset(cut)
    junk = tmp_path / "junk.h5"
    junk.write_bytes(data[:8] + b"\0" * 4000)  # the signature, then nothing
    with pytest.raises(PackedFormatError, match="cannot open as HDF5"):
        HDF5Dataset(junk)
    (tmp_path / "text.h5").write_text("not hdf5")
    with pytest.raises(PackedFormatError):
        HDF5Dataset(tmp_path / "text.h5")


def test_cli_convert_and_info(tmp_path, image_folder):
    dst = tmp_path / "out.h5"
    runner = CliRunner()
    result = runner.invoke(cli, ["convert", str(image_folder), str(dst), "--size", "16", "-j", "1", "--compression", "lzf", "-q"])
    assert result.exit_code == 0, result.output
    assert "wrote 18 images in 3 classes (3x16x16, raw)" in result.stdout
    info = runner.invoke(cli, ["info", str(dst)])
    assert info.exit_code == 0, info.output
    assert "hdf5, format version 1" in info.stdout and "samples    18" in info.stdout
    as_json = json.loads(runner.invoke(cli, ["info", str(dst), "--json"]).stdout)
    assert as_json["extra"] == {"compression": "lzf"} and as_json["shape"] == [3, 16, 16]


def test_interrupted_write_leaves_nothing(tmp_path, image_folder, monkeypatch):
    monkeypatch.setattr(hdf5_writer, "BLOCK_BYTES", 1)  # data already in the file when it stops
    real_write = HDF5Writer._write

    def failing(self, index, sample):
        if index == 5:
            raise KeyboardInterrupt
        real_write(self, index, sample)

    monkeypatch.setattr(HDF5Writer, "_write", failing)
    dst = tmp_path / "out.h5"
    with pytest.raises(KeyboardInterrupt):
        convert(image_folder, dst, image=ImageOptions(size=16), workers=1)
    assert not dst.exists() and not (tmp_path / "out.h5.partial").exists()


def test_disk_full_is_a_clear_output_error(tmp_path, image_folder, monkeypatch):
    def full(self, index, sample):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(HDF5Writer, "_write", full)
    dst = tmp_path / "out.h5"
    with pytest.raises(OutputError, match="no space left"):
        convert(image_folder, dst, image=ImageOptions(size=16), workers=1)
    assert not dst.exists() and not (tmp_path / "out.h5.partial").exists()


def test_raw_samples_of_one_shape_in_the_flat_layout_are_read(tmp_path):
    """The documented flat layout also holds raw fixed-shape samples (packer writes them fixed)."""
    pixels = np.arange(3 * 2 * 4 * 5, dtype=np.uint8).reshape(3, 2, 4, 5)
    meta = Metadata(format="hdf5", count=3, channels=1, shape=(1, 8, 5), classes=("a", "b"))
    path = tmp_path / "hand.h5"
    with h5py.File(path, "w") as f:
        f[PAYLOAD] = pixels.reshape(-1)
        f[OFFSETS] = np.arange(4, dtype=np.int64) * 40
        f[SHAPES] = np.array([[1, 8, 5]] * 3, np.int64)
        f[LABELS] = np.array([1, 0, 1], np.int64)
        f.attrs[META_ATTR] = meta.to_json()
    images, labels = HDF5Dataset(path).read_batch([2, 0])
    assert np.array_equal(images.numpy(), pixels[[2, 0]].reshape(2, 1, 8, 5)) and labels.tolist() == [1, 1]


# -- reads that bypass h5py ------------------------------------------------------------------
def plain_h5py(path: Path, indices) -> np.ndarray:
    """``images[indices]`` read one by one with plain h5py (any order, repeats allowed)."""
    with h5py.File(path, "r") as f:
        return np.stack([f[IMAGES][int(i)] for i in indices])


INDEX_CASES = [
    [17, 3, 3, 4, 5, 0],  # unsorted, repeated, a run
    [5, 5, 5],
    list(range(18)),
    list(range(17, -1, -1)),
    [-1, 0, -18],
]


def test_uncompressed_batches_bypass_h5py_and_match_its_reads(tmp_path, packed_32, monkeypatch):
    path = packed_32("hdf5")
    fast = open_store(path)
    assert not fast.serial_reads and default_threads(fast) == default_threads(None)  # not held to one thread
    monkeypatch.setattr(hdf5_rows.MappedRows, "locate", classmethod(lambda cls, file, images: None))
    slow = open_store(shutil.copy(path, tmp_path / "copy.h5"))  # its own handle, read through h5py
    assert slow.serial_reads and default_threads(slow) == 1
    rng = np.random.default_rng(0)
    cases = INDEX_CASES + [rng.integers(0, 18, 40).tolist() for _ in range(5)]
    for indices in cases:
        got, got_labels = fast.read_batch(indices)
        want, want_labels = slow.read_batch(indices)
        assert np.array_equal(got, want) and np.array_equal(got, plain_h5py(path, np.array(indices) % 18))
        assert got_labels.tolist() == want_labels.tolist()
    strided = np.zeros((6, 3, 32, 64), np.uint8)[..., ::2]  # an `out` that is not C-contiguous
    fast.read_batch(INDEX_CASES[0], out=strided)
    assert np.array_equal(strided, slow.read_batch(INDEX_CASES[0])[0])
    for i in (0, 9, 17):
        assert np.array_equal(fast.read(i)[0], slow.read(i)[0])
    for (a, la), (b, lb) in zip(fast.read_samples(range(18)), slow.read_samples(range(18))):
        assert np.array_equal(a, b) and la == lb
    assert fast.read_batch([])[0].shape == (0, 3, 32, 32)


def test_chunks_between_index_nodes_are_found(tmp_path, monkeypatch):
    """Written block by block, the chunks are not evenly spaced (HDF5 puts its index nodes between
    them), so every sample's offset is looked up; without chunk_iter, small files are still mapped."""
    monkeypatch.setattr(hdf5_writer, "BLOCK_BYTES", 64)
    n, shape = 300, (1, 4, 4)
    pixels = np.random.default_rng(1).integers(0, 256, (n, *shape), dtype=np.uint8)
    writer = HDF5Writer(tmp_path / "many.h5")
    for i in range(n):
        writer.add(Encoded(i % 3, shape, pixels[i].tobytes()))
    writer.finish(Metadata(format="hdf5", count=n, channels=1, shape=shape))
    store = open_store(tmp_path / "many.h5")
    assert not store.serial_reads
    indices = np.random.default_rng(2).permutation(n)
    assert np.array_equal(store.read_batch(indices)[0], pixels[indices])
    with h5py.File(tmp_path / "many.h5", "r") as f:
        dsid = f[IMAGES].id
        starts = hdf5_rows.chunk_starts(dsid, n, 16)
        assert len(set(np.diff(starts).tolist())) > 1  # not an arithmetic sequence

        class NoChunkIter:  # h5py built against an HDF5 older than 1.12.3
            get_num_chunks, get_chunk_info = dsid.get_num_chunks, dsid.get_chunk_info

        assert np.array_equal(hdf5_rows.chunk_starts(NoChunkIter(), n, 16), starts)
        monkeypatch.setattr(hdf5_rows, "CHUNK_INFO_LIMIT", n - 1)
        assert hdf5_rows.chunk_starts(NoChunkIter(), n, 16) is None  # too slow that way: h5py reads it
        assert hdf5_rows.chunk_starts(dsid, n, 15) is None  # chunks of another size


def test_a_contiguous_images_dataset_is_mapped_too(tmp_path):
    """Not what packer writes, but valid: ``images`` stored contiguously, samples back to back."""
    pixels = np.random.default_rng(3).integers(0, 256, (5, 3, 4, 6), dtype=np.uint8)
    path = tmp_path / "contiguous.h5"
    with h5py.File(path, "w") as f:
        f[IMAGES] = pixels
        f[LABELS] = np.arange(5, dtype=np.int64)
        f.attrs[META_ATTR] = Metadata(format="hdf5", count=5, channels=3, shape=(3, 4, 6)).to_json()
        assert f[IMAGES].chunks is None
    store = open_store(path)
    assert not store.serial_reads
    assert np.array_equal(store.read_batch([4, 0, 4, 2])[0], pixels[[4, 0, 4, 2]])


def test_threads_read_batches_at_once(packed_32):
    store = open_store(packed_32("hdf5"))
    assert not store.serial_reads
    batches = [np.random.default_rng(k).integers(0, 18, 64) for k in range(8)]
    expected = [plain_h5py(packed_32("hdf5"), b) for b in batches]
    barrier, failures = threading.Barrier(4), []

    def read(k: int) -> None:
        barrier.wait(timeout=30)
        out = np.empty((64, 3, 32, 32), np.uint8)
        for _round in range(20):
            for batch, want in zip(batches[k:] + batches[:k], expected[k:] + expected[:k]):
                store.read_batch(batch, out=out)
                if not np.array_equal(out, want):
                    failures.append(k)

    threads = [threading.Thread(target=read, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_dataloader_workers_under_spawn_read_the_mapped_file(packed_32):
    from torch.utils.data import DataLoader

    path = packed_32("hdf5")
    ds = HDF5Dataset(path)
    assert not ds.store.serial_reads  # mapped in this process first: the workers map their own
    want = plain_h5py(path, range(18))
    loader = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context=multiprocessing.get_context("spawn"))
    for _epoch in range(2):
        images = np.concatenate([x.numpy() for x, _ in loader])
        assert np.array_equal(images, want)


def test_a_replaced_file_is_mapped_afresh_and_an_open_store_keeps_its_own(tmp_path, packed_32):
    path = shutil.copy(packed_32("hdf5"), tmp_path / "data.h5")
    old = open_store(path)
    before = old.read_batch([0, 5])[0].copy()
    edited = copy_and_edit(path, tmp_path / "edited.h5", lambda f: f[IMAGES].__setitem__(0, 255 - f[IMAGES][0]))
    os.replace(edited, path)  # what `packer convert --overwrite` does: a new file under the old name
    new = open_store(path)
    assert not new.serial_reads and not old.serial_reads
    assert np.array_equal(new.read_batch([0])[0][0], 255 - before[0])
    assert np.array_equal(new.read_batch([5])[0][0], before[1])
    assert np.array_equal(old.read_batch([0, 5])[0], before)  # the file it opened, still mapped


def test_chunk_starts_found_once_serve_a_forked_worker_and_a_changed_file_is_located_again(tmp_path, packed_32, monkeypatch):
    """A DataLoader worker reopens the file after fork and visited every chunk again at every
    epoch (a scale walkthrough): what this process found
    serves it, by the file's identity; the same name holding another file is located afresh."""
    path = shutil.copy(packed_32("hdf5"), tmp_path / "data.h5")
    with h5py.File(path, "r") as f:
        first = hdf5_rows.MappedRows.locate(f, f[IMAGES])
    assert first is not None
    visits = []
    real = hdf5_rows.chunk_starts
    monkeypatch.setattr(hdf5_rows, "chunk_starts", lambda *a: visits.append(1) or real(*a))
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:  # (a worker forked from this process, which opens the file itself)
        assert pool.apply(_located_in_a_child, (str(path),)) == (True, first.starts.tolist())
    with h5py.File(path, "r") as f:
        assert np.array_equal(hdf5_rows.MappedRows.locate(f, f[IMAGES]).starts, first.starts) and visits == []
    edited = copy_and_edit(path, tmp_path / "edited.h5", lambda f: f[IMAGES].__setitem__(0, 255 - f[IMAGES][0]))
    os.replace(edited, path)
    with h5py.File(path, "r") as f:
        again = hdf5_rows.MappedRows.locate(f, f[IMAGES])
        assert visits == [1] and np.array_equal(again.data[again.starts[0]:again.starts[0] + again.nbytes], f[IMAGES][0].reshape(-1))


def _located_in_a_child(path: str) -> tuple[bool, list[int]]:
    """In a forked worker: whether the starts came without visiting the chunks, and them."""
    visited = []
    hdf5_rows.chunk_starts = lambda *a: visited.append(1)  # (this process's copy only)
    with h5py.File(path, "r") as f:
        mapped = hdf5_rows.MappedRows.locate(f, f[IMAGES])
    return not visited, mapped.starts.tolist()


def test_a_locking_conflict_says_what_to_do(image_folder, tmp_path):
    """The file open in this process with locking=False (common advice on Lustre/NFS): HDF5's
    "file locking flag values don't match" came alone (an HDF5 user's walkthrough); the line now
    says what holds it and what to do."""
    dst = tmp_path / "locked.h5"
    convert(image_folder, dst, image=ImageOptions(size=8), workers=1)
    with h5py.File(dst, "r", locking=False):
        with pytest.raises(PackedFormatError, match=r"locking flag values don't match.*locking=False.*HDF5_USE_FILE_LOCKING=FALSE"):
            HDF5Dataset(dst)[0]


def test_a_file_another_process_writes_says_so(image_folder, tmp_path):
    """Open for writing in another process (HDF5's exclusive lock, errno 11): the line says that
    process holds it; other lock failures (a filesystem without locks) say to turn locking off."""
    import subprocess
    import sys

    dst = tmp_path / "held.h5"
    convert(image_folder, dst, image=ImageOptions(size=8), workers=1)
    holder = subprocess.Popen([sys.executable, "-c", f"import h5py, sys, time; f = h5py.File({str(dst)!r}, 'a'); print('open', flush=True); "
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(PackedFormatError, match=r"unable to lock file.*another process has it open for writing"):
            HDF5Dataset(dst)[0]
    finally:
        holder.communicate("", timeout=30)
