"""A reader class given the wrong thing says so in one line: another format's finished dataset
(which format it is, and the class that reads it), something that is no packer dataset (a plain
folder, an image folder, a random file, a missing path), an unfinished conversion (its own
message, as before).

The datasets are real conversions (``packer.convert``); the expected format labels and reader
classes are written out here, not taken from the readers' own tables.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import packer
from readers import (HDF5Dataset, IncompleteDatasetError, LMDBDataset, PackedFormatError, RAMDataset, ShardDataset, StreamingShards,
                     TokenDataset, open_dataset)
from readers.schema import FORMATS

#: The class that reads each format's image datasets, and the format's name in messages.
READERS = {"lmdb": LMDBDataset, "hdf5": HDF5Dataset, "blob": RAMDataset, "webdataset": ShardDataset}
LABELS = {"lmdb": "LMDB", "hdf5": "HDF5", "blob": "blob", "webdataset": "WebDataset"}
#: Every entry point a user may hand a path to.
ALL_READERS = [*READERS.values(), TokenDataset, open_dataset]
#: What OSError, lmdb and h5py say when they are handed the wrong thing.
RAW = ("Errno", "errno", "Not a directory", "Is a directory", "Unable to", "buf =", "signature not found", "data.mdb'")

PAIRS = [(fmt, reader) for fmt in FORMATS for reader in FORMATS if reader != fmt]


def one_line(exc: BaseException) -> str:
    message = str(exc)
    assert "\n" not in message, message
    assert not any(raw in message for raw in RAW), message
    return message


def test_every_format_is_covered():
    assert set(READERS) == set(LABELS) == set(FORMATS)


@pytest.mark.parametrize("fmt, reader", PAIRS)
def test_another_formats_dataset_names_its_format_and_reader(packed_32, fmt, reader):
    path = packed_32(fmt)
    with pytest.raises(PackedFormatError) as caught:
        READERS[reader](path)
    assert type(caught.value) is PackedFormatError  # finished: not an IncompleteDatasetError
    message = one_line(caught.value)
    assert message.startswith(f"{path}: a packer {LABELS[fmt]} image dataset, not {LABELS[reader]}: "), message
    assert f"read it with readers.{READERS[fmt].__name__}(path) (or readers.open_dataset(path))" in message
    assert len(READERS[fmt](path)) == 18  # the class named reads it, the refused open left nothing behind


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "webdataset"])
def test_streaming_shards_names_the_reader_of_another_format(packed_32, fmt):
    path = packed_32(fmt)
    for given in (Path(path), str(path), [str(path)]):  # a string or list was read as a shard URL (a tar error at iteration)
        with pytest.raises(PackedFormatError) as caught:
            StreamingShards(given)
        assert f"a packer {LABELS[fmt]} image dataset, not WebDataset" in one_line(caught.value), given


def test_streaming_shards_refuses_missing_shards_and_folders_among_them(packed_32, tmp_path):
    shards = [str(p) for p in sorted(Path(packed_32("webdataset")).glob("*.tar"))]
    assert shards and len(StreamingShards(shards[:1])) > 0
    one = StreamingShards(Path(shards[0]))  # a Path to a shard is that shard (it was taken for a folder and refused)
    assert one.urls == shards[:1] and len(list(one)) == len(list(StreamingShards(shards[:1])))
    with pytest.raises(FileNotFoundError, match="gone.tar: no such shard"):
        StreamingShards(tmp_path / "gone.tar")
    with pytest.raises(FileNotFoundError, match=r"^\S*gone.tar: no such shard \(StreamingShards reads"):
        StreamingShards([*shards, str(tmp_path / "gone.tar")])
    with pytest.raises(PackedFormatError, match="a shard folder among the shards; pass the folder alone"):
        StreamingShards([*shards, packed_32("webdataset")])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_streaming_shards_reads_a_named_pipe_and_stdin_unchecked(packed_32, tmp_path):
    """Their bytes can be read once: no check may read them first (a tar check on a pipe hung)."""
    shard = sorted(Path(packed_32("webdataset")).glob("*.tar"))[0]
    expected = [label for _, label in StreamingShards([str(shard)])]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code = "import sys\nfrom readers import StreamingShards\nprint([l for _, l in StreamingShards(sys.argv[1])])"
    with open(shard, "rb") as stdin:
        from_stdin = subprocess.run([sys.executable, "-c", code, "-"], stdin=stdin, capture_output=True, text=True, timeout=120,
                                    env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert from_stdin.returncode == 0 and from_stdin.stdout.strip() == str(expected), from_stdin.stderr
    reader = subprocess.Popen([sys.executable, "-c", code, str(fifo)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    writer = threading.Thread(target=fifo.write_bytes, args=(shard.read_bytes(),), daemon=True)  # it waits for the reader
    writer.start()
    out, _ = reader.communicate(timeout=120)
    assert reader.returncode == 0 and out.strip() == str(expected)


@pytest.mark.parametrize("fmt", FORMATS)
def test_token_dataset_names_the_image_reader(packed_32, fmt):
    path = packed_32(fmt)
    with pytest.raises(PackedFormatError) as caught:
        TokenDataset(path)
    message = one_line(caught.value)
    assert f"a packer {LABELS[fmt]} dataset of 18 images, not text" in message, message
    assert f"readers.{READERS[fmt].__name__}(path)" in message


@pytest.fixture(scope="module")
def text_blob(tmp_path_factory) -> Path:
    corpus = tmp_path_factory.mktemp("corpus")
    (corpus / "a.txt").write_text("a few words of text\n" * 20)
    dst = tmp_path_factory.mktemp("text") / "t.blob"
    packer.convert(corpus, dst, format="blob", workers=1)
    return dst


@pytest.mark.parametrize("reader", [r for r in FORMATS if r != "blob"])
def test_another_formats_text_dataset_names_token_dataset(text_blob, reader):
    with pytest.raises(PackedFormatError) as caught:
        READERS[reader](text_blob)
    message = one_line(caught.value)
    assert f"a packer blob text dataset, not {LABELS[reader]}: read it with readers.TokenDataset(path)" in message, message


@pytest.fixture(scope="module")
def not_packer(tmp_path_factory, image_folder) -> dict[str, Path]:
    """Things that are no packer dataset: folders of other files, and files of other bytes."""
    root = tmp_path_factory.mktemp("other")
    (root / "plain").mkdir()
    (root / "plain" / "notes.txt").write_text("not a dataset")
    (root / "empty").mkdir()
    (root / "random.bin").write_bytes(os.urandom(4096))
    (root / "text.h5").write_text("not HDF5 either")
    return {"plain": root / "plain", "empty": root / "empty", "images": image_folder,
            "random": root / "random.bin", "named h5": root / "text.h5"}


@pytest.mark.parametrize("reader", ALL_READERS, ids=lambda r: r.__name__)
@pytest.mark.parametrize("what", ["plain", "empty", "images", "random", "named h5"])
def test_no_packer_dataset_is_one_line(not_packer, reader, what):
    path = not_packer[what]
    with pytest.raises(PackedFormatError) as caught:
        reader(path)
    message = one_line(caught.value)
    assert type(caught.value) is PackedFormatError
    assert message.startswith(f"{path}: not "), message
    assert "nor any other packer dataset" in message or "not a packer dataset" in message, message


@pytest.mark.parametrize("reader", ALL_READERS, ids=lambda r: r.__name__)
def test_a_file_named_blob_that_is_not_one_is_one_line(tmp_path, reader):
    path = tmp_path / "x.blob"
    path.write_bytes(b"NOTABLOB" + os.urandom(200))
    with pytest.raises(PackedFormatError, match="not a packer blob") as caught:
        reader(path)
    one_line(caught.value)


@pytest.mark.parametrize("reader", ALL_READERS, ids=lambda r: r.__name__)
def test_a_missing_path_is_one_line(tmp_path, reader):
    with pytest.raises(FileNotFoundError) as caught:
        reader(tmp_path / "nothing.lmdb")
    assert one_line(caught.value) == f"{tmp_path / 'nothing.lmdb'}: no such packed dataset"


@pytest.mark.parametrize("reader", ALL_READERS, ids=lambda r: r.__name__)
@pytest.mark.parametrize("fmt", FORMATS)
def test_an_unfinished_conversion_keeps_its_message(packed_32, tmp_path, fmt, reader):
    done = packed_32(fmt)
    partial = tmp_path / (done.name + ".partial")  # what a killed conversion leaves: DST.partial, no DST
    (shutil.copytree if done.is_dir() else shutil.copy)(done, partial)
    with pytest.raises(IncompleteDatasetError, match=f"{done.name}.partial is an unfinished conversion: run the same packer convert command again, with --resume") as caught:
        reader(tmp_path / done.name)
    one_line(caught.value)
    with pytest.raises(IncompleteDatasetError, match="an unfinished conversion") as caught:
        reader(partial)
    one_line(caught.value)
    (tmp_path / done.name).mkdir()  # DST made beforehand as an empty folder (as for shards/): it said "not a packer dataset"
    with pytest.raises(IncompleteDatasetError, match=f"is an empty folder; {done.name}.partial is an unfinished conversion: run the same"):
        reader(tmp_path / done.name)


@pytest.mark.parametrize("reader", [r for r in FORMATS if r != "webdataset"])
def test_another_formats_unfinished_dataset_says_it_did_not_finish(packed_32, tmp_path, reader):
    shards = tmp_path / "cut.shards"
    shutil.copytree(packed_32("webdataset"), shards)
    (shards / "packer.json").unlink()  # the metadata is written last: a conversion that did not finish
    with pytest.raises(IncompleteDatasetError, match="did not finish") as caught:
        READERS[reader](shards)
    one_line(caught.value)


def test_opening_one_format_imports_no_other_formats_library(packed_32):
    """The check asks the other formats only about a path its own format does not recognise."""
    path = packed_32("webdataset")
    probe = f"import sys\nfrom readers import ShardDataset\nShardDataset({str(path)!r})\nprint('h5py' in sys.modules, 'lmdb' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"], done.stdout + done.stderr


def test_an_lmdb_open_elsewhere_in_the_process_is_named(lmdb_32, tmp_path):
    """Plain lmdb first, then packer's reader on the same path (a notebook): py-lmdb refuses the
    second open; the one line says what to do (docs/FORMATS.md, LMDB)."""
    import shutil

    import lmdb

    path = shutil.copytree(lmdb_32, tmp_path / "own.lmdb")  # (a path no other test's reader holds)
    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        with pytest.raises(PackedFormatError, match="close the other lmdb environment on it first"):
            LMDBDataset(path)[0]
    finally:
        env.close()
    assert LMDBDataset(path)[0][1] >= 0  # (after the close it opens)


def test_open_dataset_names_an_option_the_format_does_not_take(lmdb_32):
    """Format-generic code passing the blob's ``in_memory=`` to an LMDB: one line naming the
    option, the class and what it takes (it was Python's 'unexpected keyword argument')."""
    with pytest.raises(TypeError, match=r"^open_dataset: in_memory= does not apply to .*, read by readers.LMDBDataset, which takes transform, verify$"):
        open_dataset(lmdb_32, in_memory=False)


def test_streaming_shards_refuses_a_folder_whose_listed_shard_is_gone(packed_32, tmp_path):
    """The folder's metadata lists a shard the folder no longer has: one line at construction,
    where it was a FileNotFoundError partway through the epoch (a Streaming user's walkthrough:
    one rank dies mid-epoch, the others wait forever)."""
    copy = tmp_path / "shards"
    shutil.copytree(packed_32("webdataset"), copy)
    [first, *_] = sorted(copy.glob("*.tar"))
    first.unlink()
    for given in (copy, str(copy)):
        with pytest.raises(FileNotFoundError, match=rf"^{re.escape(str(first))}: no such shard"):
            StreamingShards(given)


@pytest.mark.parametrize("opener", ["open_dataset", "ShardDataset"])
def test_a_brace_pattern_of_shards_says_to_open_the_folder_or_stream_it(packed_32, opener):
    """``packer convert`` prints webdataset's brace pattern of the shards; given to a map-style
    reader it said only "no such packed dataset"."""
    import readers

    folder = packed_32("webdataset")
    shards = sorted(p.name for p in folder.glob("*.tar"))
    pattern = f"{folder}/{shards[0][:-10]}{{{shards[0][-10:-4]}..{shards[-1][-10:-4]}}}.tar"
    with pytest.raises(FileNotFoundError) as caught:
        getattr(readers, opener)(pattern)
    line = one_line(caught.value)
    assert line == (f"{pattern}: a brace pattern of shards, which webdataset expands; a packer dataset is opened by its folder: "
                    f"readers.ShardDataset({str(folder)!r}) (or open_dataset({str(folder)!r})), or stream the pattern with "
                    f"readers.StreamingShards({pattern!r})"), line
    assert len(list(StreamingShards(pattern))) == len(ShardDataset(folder))  # what it says works
    with pytest.raises(FileNotFoundError, match="no such packed dataset$"):  # no folder there: nothing to point to
        getattr(readers, opener)(f"{folder}-missing/shard-{{000000..000001}}.tar")
