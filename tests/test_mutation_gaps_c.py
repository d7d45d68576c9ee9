"""Tests for six code paths a third mutation sweep found uncovered (a deliberate break of each
left the suite green): the LMDB batch path's value-length check, the destination lock's check
that the file it locked is still the one at the path, a label file's row naming an image in a
hidden folder, a document that tokenises to no ids, a stretch that shrinks one axis while it
grows the other, and the count of saved inputs an interrupted run with skipped inputs names.
Each was seen failing under the mutant its docstring names."""

from __future__ import annotations

import csv
import fcntl
import os
import shutil

import lmdb
import numpy as np
import pytest
from PIL import Image

from packer import ImageOptions, SourceOptions, TextOptions, convert
from packer.errors import OutputError
from packer.locking import DestinationLock, lock_text
from readers import LMDBDataset, Loader, PackedFormatError
from readers.formats.lmdb import sample_key
from roundtrip_checks import read_plain


# -- 1. readers/formats/lmdb.py, LMDBStore._fill_raw: a value of the right header, wrong length --
@pytest.mark.parametrize("change", ["extra", "short"])
def test_an_lmdb_value_of_the_wrong_length_is_refused_by_the_batch_path(tmp_path, lmdb_32, change):
    """A sample whose value keeps its 3x32x32 header but holds 3 bytes more, or 3 fewer, than
    the header's pixels (written with lmdb itself): a batch read (read_batch, Loader: the raw
    fast path) refuses it in one line naming the sample. Mutant `or len(value) != size` dropped:
    the extra bytes were read as if the sample were whole, the short value raised numpy's
    ValueError."""
    path = tmp_path / "resized.lmdb"
    shutil.copytree(lmdb_32, path)
    env = lmdb.open(str(path), subdir=True)
    with env.begin(write=True) as txn:
        value = txn.get(sample_key(5))
        txn.put(sample_key(5), value + b"\0\0\0" if change == "extra" else value[:-3])
    env.close()
    meta, plain = read_plain(path)  # as lmdb sees it: the header unchanged, the payload not 3x32x32 bytes
    assert plain[5].shape == (3, 32, 32) and len(plain[5].payload) == 3 * 32 * 32 + (3 if change == "extra" else -3)
    ds = LMDBDataset(path)
    images, labels = ds.read_batch([3, 4])  # the samples around it still read, as lmdb holds them
    assert np.array_equal(images[1].numpy(), np.frombuffer(plain[4].payload, np.uint8).reshape(3, 32, 32))
    assert int(labels[0]) == plain[3].label
    with pytest.raises(PackedFormatError, match=r"resized.lmdb: sample 5 has 30(75|69) bytes, expected 3072"):
        ds.read_batch([4, 5, 6])
    with pytest.raises(PackedFormatError, match="sample 5 "):
        for _ in Loader(LMDBDataset(path), 4, shuffle=False):
            pass


# -- 2. packer/locking.py, DestinationLock.acquire: the file locked is the one at the path --------
@pytest.mark.parametrize("replaced", [True, False])
def test_a_lock_file_replaced_before_the_flock_is_not_the_one_held(tmp_path, monkeypatch, replaced):
    """The conversion before us removes its lock file after we opened it (and another may create
    a new one at the path) before our flock succeeds: we then hold the lock of a file no longer
    at the path, which the next conversion would not see. The lock taken must be the file at the
    path: a flock on it (fcntl itself) is refused, and so is a second DestinationLock. Mutant
    `same = True` (the inode check skipped): the lock held was the removed file's."""
    import packer.locking as locking

    path = tmp_path / "out.lmdb.partial-lock"
    path.write_bytes(lock_text(999_999_999))  # the holder before us, about to let go
    real, calls = locking._lock_soon, []

    def let_go_first(fd, *args, **kwargs):
        calls.append(os.fstat(fd).st_ino)
        if len(calls) == 1:  # the holder's release() removes the file; maybe another conversion makes a new one
            path.unlink()
            if replaced:
                path.write_bytes(b"")
        return real(fd, *args, **kwargs)

    monkeypatch.setattr(locking, "_lock_soon", let_go_first)
    lock = DestinationLock(path, "out.lmdb").acquire()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT)  # (the mutant left no file at the path to open)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        assert path.read_bytes() == lock_text(os.getpid())
        assert len(calls) == 2 and calls[1] == os.stat(path).st_ino  # a second try, on the file at the path
        monkeypatch.setattr(locking, "_lock_soon", real)
        with pytest.raises(OutputError, match=rf"out.lmdb: another packer conversion \(pid {os.getpid()}\) is writing it now"):
            DestinationLock(path, "out.lmdb").acquire()
    finally:
        lock.release()
    assert not path.exists()


# -- 3. packer/sources/images.py, image_files: a label file's row naming a hidden folder's image --
def test_a_label_row_naming_an_image_in_a_hidden_folder_is_skipped_and_recorded(tmp_path):
    """A row of --labels naming `.hidden/x.png` (an image that is there, in a hidden folder, which
    packer never enters) is not converted but recorded as skipped with its row; the other rows
    convert. Mutant: image_files keeping hidden folders (`dirnames[:] = sorted(dirnames)`): the
    hidden image was converted as a third sample. The reason said "no such image", where the
    image is there (the sweep's report): it now says why it is not read."""
    root = tmp_path / "images"
    colours = {"a.png": (255, 0, 0), "b.png": (0, 0, 255), ".hidden/x.png": (0, 255, 0)}
    for name, colour in colours.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (12, 10), colour).save(root / name)
    labels = tmp_path / "labels.csv"
    with open(labels, "w", newline="") as handle:
        csv.writer(handle).writerows([["path", "label"], ["a.png", "red"], [".hidden/x.png", "green"], ["b.png", "blue"]])
    dst = tmp_path / "out.lmdb"
    report = convert(root, dst, image=ImageOptions(size=8), source=SourceOptions(labels=str(labels)), workers=1)
    assert report.written == 2
    assert [(s.path, s.reason) for s in report.skipped] == [(".hidden/x.png", "a hidden file or folder (labels.csv:3): packer "
                                                             "reads none (a name starting with '.', or a system folder); rename it")]
    meta, samples = read_plain(dst)  # with lmdb itself
    assert meta["count"] == 2 and [s["path"] for s in meta["skipped"]] == [".hidden/x.png"]
    classes = meta["classes"]  # every name of the file, sorted: blue, green, red
    assert classes == ["blue", "green", "red"]
    pixels = {classes[s.label]: np.frombuffer(s.payload, np.uint8).reshape(s.shape)[:, 4, 4].tolist() for s in samples}
    assert pixels == {"red": [255, 0, 0], "blue": [0, 0, 255]}  # the green image is in no sample


# -- 4. packer/preprocess/tokenize.py, TokenizeTask.encoded: a document of no tokens ----------------
def test_a_document_that_tokenises_to_nothing_is_skipped_not_stored_as_its_eos(tmp_path):
    """A document that is not whitespace but gives no ids (a BPE without an unknown token drops
    the letters it lacks: the tokenizers library itself says so) is skipped and recorded as
    'empty document (no tokens)', not stored as a lone EOS (docs/FORMATS.md). Mutant: the
    `if not len(ids)` check dropped: a third document of one id, the EOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    bpe = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2, "</s>": 3}, merges=[("a", "b")]))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.add_special_tokens(["</s>"])
    path = tmp_path / "tokenizer.json"
    bpe.save(str(path))
    texts = {"1.txt": "ab ba", "2.txt": "zzz qq", "3.txt": "zz ab"}
    library = Tokenizer.from_file(str(path))
    assert [library.encode(text).ids for text in texts.values()] == [[2, 1, 0], [], [2]]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, text in texts.items():
        (corpus / name).write_text(text, encoding="utf-8")
    dst = tmp_path / "out.lmdb"
    report = convert(corpus, dst, text=TextOptions(tokenizer=str(path)), workers=1)
    assert [(s.path, s.reason) for s in report.skipped] == [("2.txt", "empty document (no tokens)")]
    meta, samples = read_plain(dst)
    assert meta["tokenizer"]["eos_id"] == 3 and [s["reason"] for s in meta["skipped"]] == ["empty document (no tokens)"]
    assert [np.frombuffer(s.payload, "<u2").tolist() for s in samples] == [[2, 1, 0, 3], [2, 3]]


# -- 5. packer/preprocess/resize.py, resize: one axis shrinks while the other grows --------------
def test_a_stretch_that_shrinks_one_axis_and_grows_the_other_still_antialiases(tmp_path):
    """Rows alternately black and white, 60 rows by 20 columns, stretched to 8 rows by 40 columns
    (rows shrink 7.5x, columns grow 2x): the rows average to mid-grey, as PIL's antialiased
    bilinear resize of the same image gives. Mutant `height >= h or width >= w` (one axis growing
    taken for an enlargement, INTER_LINEAR alone): rows of 64 and 191, aliasing."""
    stripes = np.zeros((60, 20, 3), np.uint8)
    stripes[::2] = 255
    src = tmp_path / "src" / "stripes"
    src.mkdir(parents=True)
    Image.fromarray(stripes).save(src / "s.png")
    dst = tmp_path / "out.lmdb"
    convert(src.parent, dst, image=ImageOptions(size=(8, 40), resize_mode="stretch"), workers=1)
    meta, samples = read_plain(dst)
    assert meta["shape"] == [3, 8, 40]
    got = np.frombuffer(samples[0].payload, np.uint8).reshape(3, 8, 40).transpose(1, 2, 0).astype(int)
    want = np.asarray(Image.fromarray(stripes).resize((40, 8), Image.BILINEAR), int)
    assert abs(want.mean() - 127.5) < 2 and np.abs(got - want).max() <= 12, got[:, 0, 0]


# -- 6. packer/writers/journal.py, saved_inputs: an interruption's count with skipped inputs -------
def test_an_interrupted_run_counts_its_skipped_inputs_as_saved(tmp_path, with_bad, monkeypatch):
    """--on-error skip skips inputs 3 and 13 of 20; a Ctrl-C while input 17 is written: inputs 0
    to 16 are saved, the two skipped among them (what --resume does not convert again). The
    interruption and the refusal of a plain rerun say 17, and --resume finishes with every sample
    of an uninterrupted run. Mutant: saved_inputs returning the checkpoint's samples (15)."""
    from packer.errors import OutputExistsError
    from packer.writers import journal
    from packer.writers.lmdb import LMDBWriter

    reference = convert(with_bad, tmp_path / "ref.lmdb", image=ImageOptions(size=8), workers=1)
    assert (reference.inputs, reference.written) == (20, 18)
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)  # a checkpoint after every input,
    monkeypatch.setattr(LMDBWriter, "durable_in_background", property(lambda self: False))  # none deferred by a running one
    real_add, calls = LMDBWriter.add, []

    def add(self, sample):
        calls.append(1)
        if len(calls) == 16:  # the 16th sample: input 17, with inputs 3 and 13 skipped before it
            raise KeyboardInterrupt
        return real_add(self, sample)

    monkeypatch.setattr(LMDBWriter, "add", add)
    dst = tmp_path / "out.lmdb"
    with pytest.raises(KeyboardInterrupt, match=r"^interrupted: 17 of 20 inputs are saved; run the same command with --resume"):
        convert(with_bad, dst, image=ImageOptions(size=8), workers=1, on_error="skip")
    monkeypatch.setattr(LMDBWriter, "add", real_add)
    with pytest.raises(OutputExistsError, match=r"out.lmdb: an interrupted conversion saved 17 inputs; run the same command with --resume"):
        convert(with_bad, dst, image=ImageOptions(size=8), workers=1)
    report = convert(with_bad, dst, image=ImageOptions(size=8), workers=1, resume=True)
    assert (report.resumed, report.written) == (17, 18)
    (meta, samples), (ref_meta, ref_samples) = read_plain(dst), read_plain(reference.dst)
    assert samples == ref_samples and meta["skipped"] == ref_meta["skipped"] and len(meta["skipped"]) == 2
