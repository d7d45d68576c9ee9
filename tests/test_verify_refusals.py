"""``packer verify`` on what it cannot verify: refused or reported in one line, never a fault
about nothing. ``--source`` on a text dataset is refused (exit 2) before anything is checked; a
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
from packer.verify_source import compare_source
from readers.formats import open_store, store_class
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
def test_source_on_a_text_dataset_is_refused_before_anything_is_checked(corpus, tmp_path, fmt, monkeypatch):
    path = tmp_path / TARGET[fmt]
    packer.convert(corpus, path, format=fmt, workers=1)
    _damage_a_document(path, fmt)
    plain = run("verify", path)  # the damage is there to be found ...
    assert plain.exit_code == 1 and "fault: sample 1" in plain.output and "checksum mismatch" in plain.output, plain.output
    read = []
    cls = store_class(fmt)
    monkeypatch.setattr(cls, "records", lambda self, indices, _orig=cls.records: (read.append(indices), _orig(self, indices))[1])
    refused = run("verify", path, "--source", corpus, "-j", "1")  # ... but --source is refused first
    assert refused.exit_code == 2 and read == [], (refused.output, read)
    assert refused.output.splitlines() == [f"Error: --source: applies to image datasets only, and {path} holds text; drop it"]
    with pytest.raises(OptionError, match=r"^--source: applies to image datasets only, .* holds text; drop it$"):
        verify(path, source=corpus, workers=1)
    assert read == []
    with pytest.raises(OptionError, match="--source: applies to image datasets only"):  # the comparison itself refuses too
        compare_source(open_store(path), corpus, verify(path), workers=1)


def test_source_on_an_image_dataset_still_compares(lmdb_32, image_folder):
    result = run("verify", lmdb_32, "--source", image_folder, "-j", "1")
    assert result.exit_code == 0 and "18 compared with the source" in result.output, result.output


def test_workers_without_source_are_refused(lmdb_32):
    """-j sets the processes that redo the conversion for --source; alone it was silently unused."""
    result = run("verify", lmdb_32, "-j", "2")
    assert result.exit_code == 2 and result.stderr.strip() == "Error: --workers: only with --source (the processes that redo the conversion to compare with)"
    with pytest.raises(OptionError, match="--workers: only with --source"):
        verify(lmdb_32, workers=2)


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
