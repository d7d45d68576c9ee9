"""``packer verify`` on what it cannot verify: refused or reported in one line, never a fault
about nothing. ``--source`` on a text dataset compares its documents (label-file options are
refused, exit 2, before anything is checked); a
path that is not a packer dataset (or is missing) gets the one line ``packer info`` gives; a
recognised dataset that does not open stays a fault, and the summary claims nothing it did not
check (no ``?`` format, no "0 of 0 samples", no "no checksums stored")."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import packer
from packer.cli import cli
from packer.errors import OptionError
from packer.verify import verify
from readers.formats import store_class
from readers.formats.webdataset import CHECKSUM_FILE
from readers.schema import FORMATS, PackedFormatError
from corpora import write_texts

TARGET = {"lmdb": "t.lmdb", "hdf5": "t.h5", "blob": "t.blob", "webdataset": "t.shards"}
TEXTS = {"a.txt": "hello world\n", "b.txt": "a second document, a little longer\n", "c.txt": "third and last"}


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_texts(tmp_path_factory.mktemp("corpus"), TEXTS)


def _damage_a_document(path: Path, fmt: str) -> None:
    """Change one token id of document 1 (found by content: its uint16 ids, then EOS 256)."""
    payload = np.array(list(TEXTS["b.txt"].encode()) + [256], "<u2").tobytes()
    files = {"lmdb": [path / "data.mdb"], "webdataset": sorted(path.glob("*.tar"))}.get(fmt, [path])
    [(file, data)] = [(f, f.read_bytes()) for f in files if payload in f.read_bytes()]
    offset = data.find(payload)
    file.write_bytes(data[:offset] + b"x" + data[offset + 1:])  # 'a' -> 'x': a valid id, a wrong checksum


# -- --source on a text dataset ------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_source_on_a_text_dataset_compares_its_documents(corpus, tmp_path, fmt):
    """--source was refused for text datasets (a walkthrough asked for it): the corpus is
    tokenised again with the recorded options and tokenizer and compared by source name. An
    unchanged corpus passes; an edited, a removed and an added document are each named."""
    import shutil

    path = tmp_path / TARGET[fmt]
    packer.convert(corpus, path, format=fmt, workers=1)
    clean = run("verify", path, "--source", corpus, "-j", "1")
    assert clean.exit_code == 0 and "3 of 3 samples checked, checksums matched, 3 compared with the source" in clean.output, clean.output
    mine = tmp_path / "mine"
    shutil.copytree(corpus, mine)
    (mine / "a.txt").write_text("hello world, edited\n", encoding="utf-8")
    (mine / "b.txt").write_text("a second document, a little LONGER\n", encoding="utf-8")  # the same length
    (mine / "c.txt").unlink()
    (mine / "d.txt").write_text("a new document", encoding="utf-8")
    report = verify(path, source=mine, workers=1)
    faults = [str(fault) for fault in report.faults]
    assert len(faults) == 4, faults
    assert any("<- a.txt: changed: 13 tokens, the source gives 21" in f for f in faults), faults
    assert any("<- b.txt: changed: token ids differ from the source's (6 of 36)" in f for f in faults), faults
    assert any("removed from the source: c.txt is no longer among its inputs" in f for f in faults), faults
    assert "source d.txt: added: not in the dataset" in faults, faults
    with pytest.raises(OptionError, match="--labels, --classes and their options: apply to image datasets"):
        verify(path, source=corpus, workers=1, source_options=packer.SourceOptions(labels=str(mine / "a.txt")))


def test_source_with_another_tokenizer_file_is_said(tmp_path):
    """The recorded tokenizer file changed (or is another one): its ids would differ everywhere,
    so that is the one line, not a fault per document."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    (tmp_path / "c").mkdir()
    corpus = write_texts(tmp_path / "c", TEXTS)
    tok = tmp_path / "tok.json"
    for specials in (["[UNK]", "<eos>"], ["[UNK]", "<eos>", "<pad>"]):  # two tokenizers at the same path
        bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
        bpe.pre_tokenizer = pre_tokenizers.Whitespace()
        bpe.train_from_iterator(list(TEXTS.values()) * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=specials))
        bpe.save(str(tok))
        if len(specials) == 2:
            packer.convert(corpus, tmp_path / "t.blob", text=packer.TextOptions(tokenizer=str(tok), eos=1), workers=1)
            assert run("verify", tmp_path / "t.blob", "--source", corpus, "-j", "1").exit_code == 0
    report = verify(tmp_path / "t.blob", source=corpus, workers=1)
    assert [fault.message for fault in report.faults] == [
        f"the tokenizer {tok} is not the file the conversion used (its sha256 differs): its ids would differ; pass the dataset the tokenizer it recorded"]


def test_source_on_an_image_dataset_still_compares(lmdb_32, image_folder):
    result = run("verify", lmdb_32, "--source", image_folder, "-j", "1")
    assert result.exit_code == 0 and "18 compared with the source" in result.output, result.output


def test_workers_without_source_are_refused(lmdb_32):
    """-j sets the processes that redo the conversion for --source; alone it was silently unused."""
    result = run("verify", lmdb_32, "-j", "2")
    assert result.exit_code == 2 and result.stderr.strip() == "Error: --workers: only with --source (the processes that redo the conversion to compare with)"
    with pytest.raises(OptionError, match="--workers: only with --source"):
        verify(lmdb_32, workers=2)


def test_workers_for_the_source_are_capped_at_the_cores(lmdb_32, image_folder, caplog, monkeypatch):
    """verify -j 64 started 64 processes on 2 cores, without a word (a walkthrough); convert caps them."""
    import packer.parallel

    started = []
    plain = packer.parallel.ordered_map
    monkeypatch.setattr(packer.parallel, "default_workers", lambda: 2)
    monkeypatch.setattr(packer.parallel, "ordered_map", lambda *a, **k: (started.append(k["workers"]), plain(*a, **k))[1])
    with caplog.at_level("WARNING", logger="packer"):
        report = verify(lmdb_32, source=image_folder, workers=64)
    assert report.ok and started == [2]
    assert "--workers 64: this machine has 2 usable cores; using 2" in caplog.text


def test_source_options_that_do_not_fit_are_errors_not_faults(lmdb_32, image_folder, tmp_path):
    """A missing --labels file or a --classes list SRC's classes are not in were '1 fault' (exit
    1, as if the dataset were damaged); convert says them as errors (an options walkthrough)."""
    result = run("verify", lmdb_32, "--source", image_folder, "--labels", tmp_path / "x.csv")
    assert result.exit_code == 1 and result.stderr.strip() == f"Error: --labels {tmp_path / 'x.csv'}: cannot read it (No such file or directory)"
    (tmp_path / "classes.txt").write_text("zzz\n")
    result = run("verify", lmdb_32, "--source", image_folder, "--classes", tmp_path / "classes.txt")
    assert result.exit_code == 2 and result.stderr.strip().startswith(f"Error: --classes {tmp_path / 'classes.txt'}: SRC's class")
    assert "fault" not in result.output


# -- not a packer dataset, or missing: what packer info says -------------------------------
def _not_a_dataset(kind: str, image_folder: Path, tmp_path: Path) -> Path:
    if kind == "image folder":
        return image_folder
    if kind == "empty folder":
        (tmp_path / "empty").mkdir()
        return tmp_path / "empty"
    if kind == "random bytes":
        (tmp_path / "noise.bin").write_bytes(np.random.default_rng(0).bytes(4096))
        return tmp_path / "noise.bin"
    if kind == "unfinished conversion":
        (tmp_path / "t.blob.partial").write_bytes(b"")
        return tmp_path / "t.blob"
    return tmp_path / "missing.lmdb"


@pytest.mark.parametrize("kind", ["image folder", "empty folder", "random bytes", "unfinished conversion", "missing"])
def test_a_path_that_is_not_a_dataset_gets_the_line_info_gives(kind, image_folder, tmp_path):
    path = _not_a_dataset(kind, image_folder, tmp_path)
    info = run("info", path)
    result = run("verify", path)
    assert info.exit_code == 1 and len(info.output.splitlines()) == 1, info.output
    assert (result.exit_code, result.output) == (info.exit_code, info.output)
    assert "fault" not in result.output and "samples checked" not in result.output
    with pytest.raises((PackedFormatError, FileNotFoundError)) as raised:
        verify(path)
    assert f"Error: {raised.value}" == info.output.strip()


# -- a recognised dataset that does not open: a fault, and a summary that claims nothing -----
def _unopenable(kind: str, path: Path) -> None:
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[:-10])
    elif kind == "header overwritten":
        path.write_bytes(b"\0" * 64 + data[64:])
    else:  # empty: the header is written last, so a crash leaves this
        path.write_bytes(b"")


@pytest.mark.parametrize("kind", ["truncated", "header overwritten", "empty"])
def test_a_blob_that_does_not_open_is_one_fault_with_a_truthful_summary(kind, image_folder, tmp_path):
    path = tmp_path / "d.blob"
    packer.convert(image_folder, path, image=packer.ImageOptions(size=16), workers=1)
    _unopenable(kind, path)
    result = run("verify", path)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"fault: dataset: {path}: "), lines
    assert re.fullmatch(rf"Error: {re.escape(str(path))}: 1 fault \(blob; could not be opened, so no sample was checked; \d+\.\d s\)", lines[1]), lines
    report = verify(path)
    assert (report.opened, report.format, report.checked, [f.where for f in report.faults]) == (False, "blob", 0, ["dataset"])


# -- checksums the metadata records but that cannot be read --------------------------------
def test_unreadable_checksums_are_not_called_absent(image_folder, tmp_path, monkeypatch):
    path = tmp_path / "d.shards"
    packer.convert(image_folder, path, format="webdataset", image=packer.ImageOptions(size=16), workers=1)
    (path / CHECKSUM_FILE).unlink()
    result = run("verify", path)
    assert result.exit_code == 1 and f"fault: checksums: {path / CHECKSUM_FILE}: cannot read" in result.output, result.output
    assert "(webdataset; 18 of 18 samples checked, stored checksums unreadable;" in result.output.splitlines()[-1]
    # a dataset whose metadata records no checksums (written before they existed) still says so
    cls = store_class("webdataset")
    monkeypatch.setattr(cls, "_read_metadata", lambda self, _orig=cls._read_metadata: dataclasses.replace(_orig(self), checksum=""))
    result = run("verify", path)
    assert result.exit_code == 0 and "(webdataset; 18 of 18 samples checked, no checksums stored;" in result.output, result.output
