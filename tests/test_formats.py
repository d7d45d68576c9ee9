"""Every format side by side: the same source gives the same samples through every reader,
``open_dataset`` picks the right reader, and ``packer preview`` draws any of them.

Every test runs over ``readers.schema.FORMATS`` (the formats the metadata admits): a format whose
writer, store or dataset is missing or does not load fails the suite, it is never skipped."""

import importlib
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from packer.cli import cli
from packer.writers import WRITERS, get_writer
from packer.writers.base import Writer
from readers import open_dataset
from readers.formats import STORES, detect_format, store_class
from readers.formats.base import Store
from readers.open import DATASETS
from readers.schema import FORMATS


def test_every_registry_names_every_format():
    assert set(WRITERS) == set(STORES) == set(DATASETS) == set(FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_has_its_writer_store_and_dataset(fmt):
    """Each class loads (no skip while "being written": a lost module is a failure)."""
    assert issubclass(get_writer(fmt), Writer)
    assert issubclass(store_class(fmt), Store)
    module, name = DATASETS[fmt]
    assert isinstance(getattr(importlib.import_module(module), name), type)


@pytest.mark.parametrize("fmt", FORMATS)
def test_open_dataset_picks_the_reader_of_the_format(packed_32, fmt):
    path = packed_32(fmt)
    assert detect_format(path) == fmt
    ds = open_dataset(path)
    assert type(ds).__name__ == DATASETS[fmt][1]
    image, label = ds[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 32, 32) and label == 0


def test_all_formats_hold_identical_samples(packed_32):
    reference = open_dataset(packed_32("lmdb"))
    want = reference.read_batch(range(len(reference)))
    for fmt in FORMATS:
        ds = open_dataset(packed_32(fmt))
        assert ds.classes == reference.classes, fmt
        images, labels = ds.read_batch(range(len(ds)))
        assert torch.equal(images, want[0]), fmt
        assert torch.equal(labels, want[1]), fmt
        assert [ds[i][1] for i in range(len(ds))] == want[1].tolist(), fmt


@pytest.mark.parametrize("fmt", FORMATS)
def test_preview_draws_captioned_tiles(tmp_path, packed_32, fmt):
    path = packed_32(fmt)
    out = tmp_path / "grid.png"
    result = CliRunner().invoke(cli, ["preview", str(path), "-o", str(out), "--count", "4", "--tile", "32", "--seed", "1"])
    assert result.exit_code == 0, result.output
    sheet = np.asarray(Image.open(out))
    # 2x2 cells of (32 + padding) wide, (32 + caption + padding) high
    assert sheet.shape == (2 * (32 + 14 + 4) + 4, 2 * (32 + 4) + 4, 3)
    tile = sheet[4 : 4 + 32, 4 : 4 + 32]
    assert tile.std() > 5  # a real picture, not background
    again = tmp_path / "again.png"
    CliRunner().invoke(cli, ["preview", str(path), "-o", str(again), "--count", "4", "--tile", "32", "--seed", "1"])
    assert np.array_equal(np.asarray(Image.open(again)), sheet)  # seeded


def test_preview_tile_shows_the_stored_pixels(tmp_path, packed_32):
    from packer.preview import contact_sheet

    path = packed_32("lmdb")
    sheet = np.asarray(contact_sheet(path, count=1, seed=0, tile=32))
    index = int(np.random.default_rng(0).choice(18, size=1, replace=False)[0])
    pixels = open_dataset(path)[index][0].permute(1, 2, 0).numpy()
    assert np.array_equal(sheet[4 : 4 + 32, 4 : 4 + 32], pixels)


def test_preview_bad_input(tmp_path, packed_32):
    runner = CliRunner()
    missing = runner.invoke(cli, ["preview", str(tmp_path / "nope.lmdb")])
    assert missing.exit_code == 1 and "no such packed dataset" in missing.output and "Traceback" not in missing.output
    bad = runner.invoke(cli, ["preview", str(packed_32("lmdb")), "-o", str(tmp_path / "grid.xyz")])
    assert bad.exit_code != 0 and "use a .png or .jpg name" in bad.output


def test_preview_never_empties_a_file_it_cannot_write(tmp_path, packed_32):
    """-o victim.h5: Pillow opened (emptied) the file, then its HDF5 stub could not write; a
    packer dataset of that name, even the one previewed, was lost (a commands walkthrough)."""
    runner = CliRunner()
    for fmt in ("hdf5", "lmdb"):
        dataset = tmp_path / f"copy-{fmt}"
        shutil.copytree(packed_32(fmt), dataset) if packed_32(fmt).is_dir() else shutil.copy(packed_32(fmt), dataset)
        before = sorted((p.name, p.read_bytes()) for p in ([dataset] if dataset.is_file() else dataset.iterdir()))
        for source in (packed_32("blob"), dataset):
            result = runner.invoke(cli, ["preview", str(source), "-o", str(dataset)])
            assert result.exit_code == 2 and "Traceback" not in result.output, result.output
            assert sorted((p.name, p.read_bytes()) for p in ([dataset] if dataset.is_file() else dataset.iterdir())) == before
    mine = tmp_path / "notes.h5"
    mine.write_bytes(b"my own HDF5 file, not packer's")
    result = runner.invoke(cli, ["preview", str(packed_32("blob")), "-o", str(mine)])
    assert result.exit_code == 2 and result.stderr == f"Error: -o {mine}: Pillow cannot write HDF5 images; use a .png or .jpg name\n"
    assert mine.read_bytes() == b"my own HDF5 file, not packer's"
    sheet = tmp_path / "sheet.png"
    sheet.write_bytes(b"old")
    assert runner.invoke(cli, ["preview", str(packed_32("blob")), "-o", str(sheet)]).exit_code == 0
    assert Image.open(sheet).size[0] > 0 and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
