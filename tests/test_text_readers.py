"""A text dataset through every reader and tool, in every format: ``open_dataset``, the image
datasets (which refuse it), ``packer info``, ``packer preview``, ``packer verify``.

The corpus is written here; the expected token ids are worked out here, independently of packer:
the default ``bytes`` tokenizer gives each document's UTF-8 bytes, then the EOS id 256.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import packer
from packer.cli import cli
from packer.preview import document_preview
from packer.verify import verify
from readers import HDF5Dataset, LMDBDataset, PackedFormatError, RAMDataset, ShardDataset, TokenDataset, open_dataset
from readers.formats import open_store
from readers.formats.tokens import TokenStore
from readers.tokenizer import TokenizerError
from readers.schema import FORMATS
from corpora import write_texts

EOS = 256
#: Sorted by name, as the corpus is read; multi-byte UTF-8 and a document without a final newline.
TEXTS = {
    "a.txt": "hello world\n",
    "b.txt": "héllo 東京, a second document\nwith two lines\n",
    "c.txt": "third — and last",
}
DATASETS = {"lmdb": LMDBDataset, "hdf5": HDF5Dataset, "blob": RAMDataset, "webdataset": ShardDataset}
TARGET = {"lmdb": "t.lmdb", "hdf5": "t.h5", "blob": "t.blob", "webdataset": "t.shards"}


def expected_ids(text: str) -> list[int]:
    return list(text.encode("utf-8")) + [EOS]


DOCS = [expected_ids(t) for t in TEXTS.values()]
STREAM = np.array([i for doc in DOCS for i in doc], np.int64)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_texts(tmp_path_factory.mktemp("corpus"), TEXTS)


@pytest.fixture(scope="module")
def converted(corpus, tmp_path_factory):
    """``fmt -> path``: the corpus converted to ``fmt`` once per module (read only)."""
    made: dict[str, Path] = {}

    def get(fmt: str) -> Path:
        if fmt not in made:
            made[fmt] = tmp_path_factory.mktemp(fmt) / TARGET[fmt]
            packer.convert(corpus, made[fmt], format=fmt, workers=1)
        return made[fmt]

    return get


@pytest.fixture()
def fresh(corpus, tmp_path):
    """``fmt -> path``: a conversion of its own, to damage."""
    return lambda fmt: (packer.convert(corpus, tmp_path / TARGET[fmt], format=fmt, workers=1), tmp_path / TARGET[fmt])[1]


def test_every_format_is_covered():
    assert set(DATASETS) == set(FORMATS) == set(TARGET)


# -- the Python API ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_open_dataset_gives_the_documents(converted, fmt):
    ds = open_dataset(converted(fmt))
    assert isinstance(ds, TokenDataset) and ds.meta.kind == "text" and ds.meta.format == fmt
    assert len(ds) == len(TEXTS)
    for i, (text, ids) in enumerate(zip(TEXTS.values(), DOCS)):
        doc = ds[i]
        assert doc.tolist() == ids
        assert bytes(doc[:-1].tolist()).decode("utf-8") == text  # decoded independently of packer
        assert ds.decode(doc[:-1]) == text  # and with the tokenizer the dataset records


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "webdataset"])
def test_in_memory_is_refused_where_it_cannot_apply(converted, fmt):
    """Only a blob is copied into shared memory: in_memory=True on another format was ignored
    without a word (a read of the code)."""
    with pytest.raises(ValueError, match=f"in_memory=True copies a blob into shared memory, and this is a {fmt} dataset"):
        TokenDataset(converted(fmt), in_memory=True)
    assert TokenDataset(converted("blob"), in_memory=True)[0].tolist() == DOCS[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_open_dataset_blocks_cross_documents(converted, fmt):
    ds = open_dataset(converted(fmt), block_size=7)
    assert len(ds) == (len(STREAM) - 1) // 7
    for i in range(len(ds)):
        x, y = ds[i]
        assert x.tolist() == STREAM[7 * i : 7 * i + 7].tolist() and y.tolist() == STREAM[7 * i + 1 : 7 * i + 8].tolist()
    windows, starts = ds.read_batch([2, 0, 5])
    assert starts.tolist() == [14, 0, 35]
    assert windows.tolist() == [STREAM[s : s + 8].tolist() for s in (14, 0, 35)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_token_span_is_the_stream(converted, fmt):
    tokens = TokenStore(converted(fmt))
    assert tokens.num_tokens == len(STREAM) == tokens.meta.tokens
    assert tokens.offsets.tolist() == np.cumsum([0] + [len(d) for d in DOCS]).tolist()
    for start in range(len(STREAM) + 1):
        for stop in range(start, len(STREAM) + 1, 5):
            assert tokens.span(start, stop).tolist() == STREAM[start:stop].tolist(), (start, stop)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_store_serves_the_payload_stream(converted, fmt):
    store = open_store(converted(fmt))
    payloads = b"".join(np.array(d, "<u2").tobytes() for d in DOCS)
    assert store.read_stream(0, len(payloads)).tobytes() == payloads
    assert store.read_stream(3, 41).tobytes() == payloads[3:41]
    assert [bytes(p) for _l, _s, p in store.records(range(len(DOCS)))] == [np.array(d, "<u2").tobytes() for d in DOCS]
    with pytest.raises(IndexError):
        store.read_stream(0, len(payloads) + 1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_image_readers_refuse_a_text_dataset_in_one_line(converted, fmt):
    path = converted(fmt)
    for attempt in (lambda: DATASETS[fmt](path), lambda: open_store(path).read(0), lambda: open_store(path).read_samples([0])):
        with pytest.raises(PackedFormatError) as caught:
            attempt()
        message = str(caught.value)
        assert "readers.TokenDataset" in message and "text dataset" in message and "\n" not in message
        assert "corrupt" not in message
    with pytest.raises(TypeError, match="TokenDataset"):
        open_dataset(path, transform=lambda t: t)


def test_open_dataset_still_opens_images(packed_32):
    ds = open_dataset(packed_32("lmdb"))
    image, label = ds[0]
    assert isinstance(ds, LMDBDataset) and image.dtype == torch.uint8 and image.shape == (3, 32, 32) and label == 0


# -- the command line ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_info_shows_documents_tokens_and_tokenizer(converted, fmt):
    path = converted(fmt)
    result = CliRunner().invoke(cli, ["info", str(path)])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split(None, 1)[1] for line in result.output.splitlines()[1:] if line.startswith("  ") and line.split()}
    assert rows["format"].startswith(fmt)
    assert rows["documents"] == str(len(TEXTS))
    assert rows["tokens"].startswith(f"{len(STREAM)} ")
    assert rows["tokenizer"].startswith("bytes, vocab 257") and "eos 256" in rows["tokenizer"]  # (kind and name alike: said once)
    data = json.loads(CliRunner().invoke(cli, ["info", str(path), "--json"]).output)
    assert (data["kind"], data["count"], data["tokens"], data["dtype"]) == ("text", len(TEXTS), len(STREAM), "uint16")


@pytest.mark.parametrize("fmt", FORMATS)
def test_preview_prints_the_first_documents_decoded(converted, fmt, tmp_path):
    path = converted(fmt)
    result = CliRunner().invoke(cli, ["preview", str(path)])  # (-o and the other sheet options: refused, tests/test_preview_text.py)
    assert result.exit_code == 0, result.output
    assert result.output == document_preview(path, count=3) + "\n"
    assert all(text in result.output for text in list(TEXTS.values())[:3])
    one = CliRunner().invoke(cli, ["preview", str(path), "--count", "1"])
    assert one.output.count("--- document") == 1


def test_the_contact_sheet_itself_refuses_text_in_one_line(converted, tmp_path):
    from packer.errors import PackerError
    from packer.preview import preview

    path = converted("lmdb")
    with pytest.raises(PackerError, match="has no images for a contact sheet: print its first documents, decoded"):
        preview(path, tmp_path / "grid.png")


@pytest.mark.parametrize("fmt", FORMATS)
def test_document_preview_and_head_print_the_decoded_documents(converted, fmt):
    path = converted(fmt)
    shown = document_preview(path, count=2)
    texts = list(TEXTS.values())
    # each document as it was, its EOS not shown (the bytes tokenizer's decode makes it a newline: one character more)
    names = list(TEXTS)  # each document's source, as the conversion recorded it (`packer head` did not say: a walkthrough)
    assert shown == (f"--- document 0 ({len(DOCS[0])} tokens, from {names[0]})\n{texts[0]}\n"
                     f"--- document 1 ({len(DOCS[1])} tokens, from {names[1]})\n{texts[1]}")
    head = CliRunner().invoke(cli, ["head", str(path), "-n", "3"])
    assert head.exit_code == 0 and all(text in head.output for text in texts)


@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_checks_every_document(converted, fmt):
    path = converted(fmt)
    report = verify(path)
    assert report.ok, report.faults
    assert (report.checked, report.tokens, report.checksums) == (len(TEXTS), len(STREAM), True)
    result = CliRunner().invoke(cli, ["verify", str(path)])
    assert result.exit_code == 0
    assert result.output.startswith(f"{path}: OK ({fmt}; {len(TEXTS)} of {len(TEXTS)} samples checked, checksums matched;")


def _document_file_offset(path: Path, fmt: str, index: int) -> tuple[Path, int]:
    """The file holding document ``index``'s ids and their offset in it (found by content)."""
    payload = np.array(DOCS[index], "<u2").tobytes()
    files = {"lmdb": [path / "data.mdb"], "webdataset": sorted(path.glob("*.tar"))}.get(fmt, [path])
    [(file, data)] = [(f, f.read_bytes()) for f in files if payload in f.read_bytes()]
    assert data.count(payload) == 1
    return file, data.find(payload)


@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_finds_a_document_that_lost_its_eos(fresh, fmt):
    path = fresh(fmt)
    file, offset = _document_file_offset(path, fmt, 1)
    eos_high_byte = offset + 2 * len(DOCS[1]) - 1  # 256 = 0x0100, little-endian: 00 01
    with open(file, "r+b") as handle:
        handle.seek(eos_high_byte)
        assert handle.read(1) == b"\x01"
        handle.seek(eos_high_byte)
        handle.write(b"\x00")
    result = CliRunner().invoke(cli, ["verify", str(path)])
    assert result.exit_code == 1
    faults = [line for line in result.output.splitlines() if line.startswith("fault: ")]
    assert len(faults) == 2 and all(line.startswith("fault: sample 1") for line in faults), faults
    assert "checksum mismatch" in faults[0] and "does not end with the end-of-document id 256" in faults[1]


def test_verify_finds_a_wrong_npy_header_in_a_text_shard(fresh):
    path = fresh("webdataset")
    [shard] = sorted(path.glob("*.tar"))
    data = shard.read_bytes()
    n = len(DOCS[0])
    old, new = f"'shape': ({n},)".encode(), f"'shape': ({n + 1},)".encode()
    assert data.count(old) == 1 and len(old) == len(new)
    shard.write_bytes(data.replace(old, new))  # the payload and its checksum are untouched
    report = verify(path)
    assert [(f.where, f.message.split(" says")[0]) for f in report.faults] == [(f"sample 0 ({shard.name})", "its .npy header")]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_url_opens_a_text_dataset_as_its_path(converted, fmt):
    """``file://`` paths, as every reader takes them (README): a text dataset's became
    ``file:/...`` and 'no such packed dataset' (a walkthrough)."""
    url = "file://" + str(converted(fmt).resolve())
    assert TokenDataset(url)[1].tolist() == DOCS[1]
    assert open_dataset(url, block_size=7)[2][0].tolist() == STREAM[14:21].tolist()
    assert TokenStore("file://localhost" + str(converted(fmt).resolve())).document(2).tolist() == DOCS[2]


def test_block_indices_and_sizes_are_integers(converted):
    blocks = TokenDataset(converted("blob"), block_size=np.int64(7))  # (a config's numpy integer was refused)
    assert blocks.block_size == 7 and blocks[np.int64(1)][0].tolist() == STREAM[7:14].tolist()
    for index in (1.5, "3", slice(0, 2)):
        with pytest.raises(TypeError, match=f"^TokenDataset indices must be integers, not {type(index).__name__}$"):
            blocks[index]
    for size in (True, 2.5):  # (True was one-token blocks)
        with pytest.raises(TypeError, match="^block_size must be a positive integer, got"):
            TokenDataset(converted("blob"), block_size=size)


def test_an_expected_tokenizer_that_is_no_file_is_one_line(converted):
    with pytest.raises(TokenizerError, match=r"expect_tokenizer='gpt2' is no file: give the tokenizer file it was made with"):
        TokenDataset(converted("blob"), expect_tokenizer="gpt2")
    assert len(TokenDataset(converted("blob"), expect_tokenizer="bytes")) == len(DOCS)


def test_a_resume_state_over_other_blocks_is_refused_naming_them(converted):
    """A Loader or ResumableSampler state names its samples by index; a TokenDataset's index is a
    block, so a state saved over random windows of seed 0 loaded into windows of seed 1 (the same
    count) continued over other tokens without a word (last session's left-alone list)."""
    from readers import Loader, ResumableSampler
    from readers.epoch import ResumeError

    path = converted("blob")
    saved = Loader(TokenDataset(path, block_size=4, random_windows=True, seed=0), batch_size=2).state_dict()
    same = Loader(TokenDataset(path, block_size=4, random_windows=True, seed=0), batch_size=2)
    same.load_state_dict(saved)
    for other, said in [(TokenDataset(path, block_size=4, random_windows=True, seed=1), "random windows of seed 1"),
                        (TokenDataset(path, block_size=4), "blocks of 4 tokens, consecutive")]:
        assert len(other) == len(same.dataset)
        with pytest.raises(ResumeError, match=rf"saved over items='blocks of 4 tokens, random windows of seed 0', .* reads items='.*{said}'"):
            Loader(other, batch_size=2).load_state_dict(saved)
        with pytest.raises(ResumeError, match="items="):
            ResumableSampler(other, 2).load_state_dict(saved)
    # another block size: another count of blocks too, and the size is what is named (it was 'samples=...')
    with pytest.raises(ResumeError, match=r"saved over items='blocks of 4 tokens, random windows of seed 0', this loader reads "
                                          r"items='blocks of 8 tokens, random windows of seed 0'"):
        Loader(TokenDataset(path, block_size=8, random_windows=True, seed=0), batch_size=2).load_state_dict(saved)


def test_random_windows_are_drawn_afresh_each_epoch_and_again_for_a_resume(converted):
    """Random windows were the same every epoch (a text walkthrough: nanoGPT draws new ones each
    batch): they are drawn from the epoch too, which the Loader gives the dataset; the same epoch
    draws the same windows, so a resume mid-epoch reads exactly the rest."""
    from readers import Loader

    path = converted("blob")
    stream = np.concatenate([np.asarray(doc) for doc in DOCS])
    ds = TokenDataset(path, block_size=4, random_windows=True, seed=5)
    loader = Loader(ds, batch_size=4)
    epochs = [[int(s) for _, starts in loader for s in starts] for _ in range(2)]
    assert sorted(epochs[0]) != sorted(epochs[1]) and loader.epoch == 2
    for window in ds.read_batch(range(len(ds)))[0]:  # (epoch 1's, read last): windows of the stream
        assert any((stream[i : i + 5] == window).all() for i in range(len(stream) - 4))
    fresh = Loader(TokenDataset(path, block_size=4, random_windows=True, seed=5), batch_size=4)
    fresh.set_epoch(1)
    it = iter(fresh)
    head = [int(s) for s in next(it)[1]]
    state = fresh.state_dict()
    resumed = Loader(TokenDataset(path, block_size=4, random_windows=True, seed=5), batch_size=4)
    resumed.load_state_dict(state)
    assert head + [int(s) for _, starts in resumed for s in starts] == epochs[1]


def test_a_sampler_gives_persistent_workers_each_epochs_windows(converted):
    """Through ResumableSampler and a DataLoader's persistent workers (their copies of the dataset
    follow the epoch in shared memory): each epoch's windows are the Loader's for that epoch."""
    from torch.utils.data import DataLoader

    from readers import Loader, ResumableSampler

    path = converted("blob")
    ds = TokenDataset(path, block_size=4, random_windows=True, seed=5)
    sampler = ResumableSampler(ds, 4, shuffle=False)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, persistent_workers=True)
    reference = Loader(TokenDataset(path, block_size=4, random_windows=True, seed=5), batch_size=4, shuffle=False)
    seen = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        seen.append(torch.cat([x for x, _ in loader]))
        reference.set_epoch(epoch)
        list(reference)  # (its iteration gives its dataset the epoch)
        windows, _ = reference.dataset.read_batch(range(len(ds)))
        assert torch.equal(seen[-1], torch.from_numpy(windows[:, :-1].astype(np.int64)).to(seen[-1].dtype)), epoch
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])


def test_a_whole_document_keeps_its_windows_line_endings(tmp_path):
    """README: a whole .txt document is tokenised as its bytes are, \\r\\n kept (nanoGPT's
    open().read() would make it \\n): the bytes tokenizer's ids are the file's bytes, then EOS."""
    corpus = tmp_path / "crlf"
    corpus.mkdir()
    (corpus / "a.txt").write_bytes(b"one\r\ntwo\r\n")
    packer.convert(corpus, tmp_path / "c.blob", workers=1)
    assert TokenDataset(tmp_path / "c.blob")[0].tolist() == list(b"one\r\ntwo\r\n") + [EOS]
