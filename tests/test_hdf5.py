"""HDF5 specifics: the documented layout read with plain h5py, compression, both layouts,
refused and corrupt files, the CLI, and interrupted writes."""

import json
import re
import shutil
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
from readers.formats.hdf5 import CHECKSUMS, IMAGES, LABELS, META_ATTR, OFFSETS, PAYLOAD, SHAPES

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
        assert set(f) == {IMAGES, LABELS, CHECKSUMS}
        assert f[IMAGES].shape == (18, 3, 32, 32) and f[IMAGES].chunks == (1, 3, 32, 32) and f[IMAGES].compression is None
        assert f[LABELS].dtype == np.int64 and f[LABELS][()].tolist() == [0] * 6 + [1] * 6 + [2] * 6
        assert json.loads(f.attrs[META_ATTR])["extra"] == {"compression": None}


def test_variable_shapes_use_the_flat_layout(shorter_h5):
    with h5py.File(shorter_h5, "r") as f:
        assert set(f) == {PAYLOAD, OFFSETS, SHAPES, LABELS, CHECKSUMS}
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
    with h5py.File(dst, "r") as f:
        assert f[IMAGES].compression == compression
    assert store.read_batch([])[0].shape == (0, 3, 32, 32)
    indices = [17, 3, 3, 4, 5, 0]  # unsorted, repeated, a run
    assert np.array_equal(store.read_batch(indices)[0], plain.read_batch(indices)[0])
    assert np.array_equal(store.read(9)[0], plain.read(9)[0])


@pytest.mark.parametrize("encoding", ["jpeg", "png"])
def test_encoded_samples_read_back(tmp_path, image_folder, packed_32, encoding):
    dst = tmp_path / "enc.hdf5"
    convert(image_folder, dst, image=ImageOptions(size=32, encoding=encoding, quality=95), storage=StorageOptions(compression="gzip"), workers=1)
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
    assert "wrote 18 images (3x16x16, raw)" in result.stdout
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
