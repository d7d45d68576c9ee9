"""An HDF5 file whose samples moved from the fixed layout to the flat one (a later sample of
another shape) is copied without their first copy at the end: HDF5 never gives back a deleted
dataset's space, and the file kept it, up to as large as the samples (a plain-library
walkthrough: 194 MB where the same samples take 112)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from PIL import Image

import packer.writers.hdf5 as hdf5_writer
import packer.writers.journal as journal
from packer import ImageOptions, convert
from readers import open_dataset


@pytest.fixture
def mixed(tmp_path):
    """40 pictures of 32x32, then one of 24x16: the last moves the first 40 to the flat layout."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "z").mkdir()
    rng = np.random.default_rng(0)
    for i in range(40):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(src / "a" / f"{i:02d}.png")
    Image.fromarray(rng.integers(0, 255, (16, 24, 3), dtype=np.uint8)).save(src / "z" / "odd.png")
    return src


def plain(path):
    """Every sample's bytes and label, read with h5py as docs/FORMATS.md says."""
    with h5py.File(path, "r") as f:
        offsets, payload = f["offsets"][:], f["payload"][:]
        return [(payload[a:b].tobytes(), int(label)) for a, b, label in zip(offsets[:-1], offsets[1:], f["labels"][:])]


def test_moved_samples_leave_no_dead_copy(mixed, tmp_path, monkeypatch):
    monkeypatch.setattr(hdf5_writer, "BLOCK_BYTES", 4096)  # (a block per sample: the fixed layout is chosen, then left)
    h5 = convert(mixed, tmp_path / "out.h5", image=ImageOptions(), workers=1).dst
    blob = convert(mixed, tmp_path / "out.blob", image=ImageOptions(), workers=1).dst
    samples = 40 * 3 * 32 * 32 + 3 * 16 * 24
    assert h5.stat().st_size < samples + 64 * 1024, (h5.stat().st_size, samples)  # (it was about twice the samples)
    a, b = open_dataset(h5), open_dataset(blob)
    assert len(a) == len(b) == 41
    for i in range(41):
        assert np.array_equal(a[i][0].numpy(), b[i][0].numpy()) and a[i][1] == b[i][1]
    assert [s for s, _ in plain(h5)][-1] == b[40][0].numpy().tobytes()
    assert not (tmp_path / "out.h5.partial-journal").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["out.blob", "out.h5", "src"]


def test_a_resume_from_a_checkpoint_taken_before_the_move(mixed, tmp_path, monkeypatch):
    """Killed after the move with its last checkpoint from before it (the journal says 'fixed',
    the file has no 'images' any more): the resumed run goes on in the flat layout."""
    from checkpoints import interrupt_at_call

    monkeypatch.setattr(hdf5_writer, "BLOCK_BYTES", 4096)
    reference = plain(convert(mixed, tmp_path / "ref.h5", image=ImageOptions(), workers=1).dst)
    dst = tmp_path / "out.h5"
    with monkeypatch.context() as patched:
        patched.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 20)
        interrupt_at_call(patched, hdf5_writer.HDF5Writer, "_write_index", 1)  # after the move, in the finish
        with pytest.raises(KeyboardInterrupt):
            convert(mixed, dst, image=ImageOptions(), workers=1)
    report = convert(mixed, dst, image=ImageOptions(), workers=1, resume=True)
    assert report.resumed == 40 and plain(dst) == reference


def test_too_little_free_disk_keeps_the_file_as_it_is_said(mixed, tmp_path, monkeypatch, caplog):
    import os

    import packer.writers.hdf5_compact as compacting

    monkeypatch.setattr(hdf5_writer, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(compacting, "free_bytes", lambda folder: 4096)
    h5 = convert(mixed, tmp_path / "out.h5", image=ImageOptions(), workers=1).dst
    assert "stay in the file, not copied without them (" in caplog.text and "h5repack does it later" in caplog.text
    assert h5.stat().st_size > 40 * 3 * 32 * 32 + 3 * 16 * 24 + 64 * 1024 and len(plain(h5)) == 41  # complete, with its dead copy
    assert sorted(os.listdir(tmp_path)) == ["out.h5", "src"]
