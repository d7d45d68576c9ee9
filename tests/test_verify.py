"""``packer verify`` and the per-sample checksums: a flipped byte anywhere is found and located."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest
from click.testing import CliRunner

from packer import ImageOptions, StorageOptions, convert
from packer.cli import cli
from packer.verify import verify
from readers.checksums import CHECKSUM, sample_checksum
from readers.formats import open_store
from readers.formats.blob import BlobHeader, HEADER, SOURCES_HEADER
from readers.formats.hdf5 import SOURCES
from readers.formats.lmdb import SOURCES_KEY
from readers.formats.webdataset import INDEX_FILE, SOURCES_FILE
from readers import StreamingShards
from readers.schema import PackedFormatError

FORMATS = ("lmdb", "hdf5", "blob", "webdataset")
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob", "webdataset": ".shards"}
VICTIM = 7  # the sample whose bytes get flipped


def _convert(src: Path, dst: Path, fmt: str, encoding: str = "raw") -> Path:
    storage = StorageOptions(shard_size=5) if fmt == "webdataset" else None
    convert(src, dst, format=fmt, image=ImageOptions(size=16, encoding=encoding), storage=storage, workers=1)
    return dst


@pytest.fixture()
def packed(image_folder, tmp_path):
    """A function ``(fmt, encoding) -> path``: a fresh 16x16 conversion to damage."""
    return lambda fmt, encoding="raw": _convert(image_folder, tmp_path / f"d{SUFFIX[fmt]}", fmt, encoding)


def _flip(path: Path, offset: int, xor: int = 0x01) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ xor]))


def _payload_location(path: Path, fmt: str, index: int) -> tuple[Path, int]:
    """The file holding sample ``index``'s payload and the payload's offset in it."""
    if fmt == "lmdb":
        return path / "data.mdb", _lmdb_value_offset(path, index) + 16  # after the 16-byte sample header
    store = open_store(path)
    if fmt == "webdataset":
        row = np.load(path / INDEX_FILE)[index]
        return path / store.meta.extra["shards"][int(row[0])], int(row[1])
    [payload] = [bytes(payload) for _label, _shape, payload in store.records([index])]  # copied inside the read
    data = path.read_bytes()
    assert data.count(payload) == 1
    return path, data.find(payload)


def _lmdb_value_offset(path: Path, index: int) -> int:
    """Where in ``data.mdb`` the value the lmdb library reads for sample ``index`` lies: found
    from its address in the library's read-only map (/proc/self/maps), not by searching the file
    for its bytes, since LMDB's copy-on-write leaves older copies of a page in freed pages (a
    checkpoint's commit in mid-conversion did: the bytes were found twice)."""
    target = str((path / "data.mdb").resolve())
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True)
    try:
        with env.begin(buffers=True) as txn:
            value = txn.get(b"%010d" % index)
            address = np.frombuffer(value, np.uint8).__array_interface__["data"][0]
            with open("/proc/self/maps") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].strip() == target:
                        low, high = (int(x, 16) for x in fields[0].split("-"))
                        if low <= address < high:
                            return address - low + int(fields[2], 16)
    finally:
        env.close()
    raise AssertionError(f"sample {index}'s value is not in the map of {target}")


def _label_location(path: Path, fmt: str, index: int) -> tuple[Path, int]:
    """Where the low byte of sample ``index``'s label is stored."""
    if fmt == "lmdb":
        file, offset = _payload_location(path, fmt, index)
        return file, offset - 16  # the 16-byte sample header: label int32 first
    if fmt == "hdf5":
        with h5py.File(path, "r") as f:
            return path, f["labels"].id.get_offset() + 8 * index
    if fmt == "blob":
        with open(path, "rb") as handle:
            header = BlobHeader.unpack(handle.read(HEADER.size), where="t", file_size=path.stat().st_size)
        return path, header.sections["labels"][0] + 8 * index
    index_file = path / INDEX_FILE
    header_size = len(index_file.read_bytes()) - np.load(index_file).nbytes
    return index_file, header_size + 8 * (7 * index + 3)


@pytest.mark.parametrize("fmt", FORMATS)
def test_checksums_are_recorded_and_match(packed, fmt):
    path = packed(fmt)
    store = open_store(path)
    assert store.meta.checksum == CHECKSUM
    stored = store.stored_checksums()
    assert stored.dtype == np.dtype("<u4") and stored.shape == (len(store),)
    expected = [sample_checksum(label, shape, bytes(payload)) for label, shape, payload in store.records(range(len(store)))]
    assert stored.tolist() == expected
    assert store.meta.checksums_sha256 == hashlib.sha256(np.array(expected, "<u4").tobytes()).hexdigest()  # (FORMATS.md's recipe)
    report = verify(path)
    assert report.ok and report.checked == len(store), report.faults


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_flipped_pixel_byte_is_found(packed, fmt):
    path = packed(fmt)
    file, offset = _payload_location(path, fmt, VICTIM)
    _flip(file, offset + 100)
    report = verify(path)
    assert not report.ok
    assert [f.where.split(" (")[0] for f in report.faults] == [f"sample {VICTIM}"]
    assert "checksum mismatch" in report.faults[0].message
    if fmt == "webdataset":
        assert "shard-000001.tar" in report.faults[0].where  # sample 7 is in the second shard of 5


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_flipped_label_is_found(packed, fmt):
    path = packed(fmt)
    file, offset = _label_location(path, fmt, VICTIM)
    _flip(file, offset)  # label 1 <-> 0: still a valid class, only the checksum can tell
    report = verify(path)
    assert not report.ok
    assert any(f.where.startswith(f"sample {VICTIM}") and "checksum mismatch" in f.message for f in report.faults), report.faults
    if fmt == "webdataset":  # the .cls member as text, not a bytes repr (b'0')
        assert any(re.fullmatch(r"its \.cls member says '\d', the index says \d", f.message) for f in report.faults), report.faults


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "blob", "webdataset"])
def test_a_damaged_jpeg_is_found_and_cli_exits_non_zero(packed, fmt):
    path = packed(fmt, "jpeg")
    file, offset = _payload_location(path, fmt, VICTIM)
    _flip(file, offset + 1, 0xFF)  # the JPEG marker: no longer a JPEG
    result = CliRunner().invoke(cli, ["verify", str(path)])
    assert result.exit_code == 1
    assert f"fault: sample {VICTIM}" in result.output and "does not decode" in result.output
    assert "2 faults" in result.stderr  # the checksum and the decode
    assert "Traceback" not in result.output


def test_a_damaged_tar_header_is_found(packed):
    path = packed("webdataset")
    shard = path / "shard-000000.tar"
    _flip(shard, 3)  # inside the first member's name
    report = verify(path)
    assert any("shard-000000.tar" in f.where and "tar header" in f.message for f in report.faults), report.faults


def test_garbage_in_a_members_npy_header_is_a_fault_not_a_traceback(packed):
    """Bytes that are not text in a raw sample's .npy header made numpy's header parser raise
    tokenize's TokenError through verify and StreamingShards (a Streaming user's walkthrough)."""
    path = packed("webdataset")
    shard = path / "shard-000000.tar"
    with open(shard, "r+b") as handle:
        handle.seek(512 + 60)  # the first member's .npy header text, after the tar header and the magic
        handle.write(b"\xff" * 20)
    report = verify(path)
    assert [f.where for f in report.faults] == ["sample 0 (shard-000000.tar)"] and "bad .npy header" in report.faults[0].message
    with pytest.raises(PackedFormatError, match=r"shard-000000.tar: member 0000000000.npy: bad .npy header"):
        list(StreamingShards(str(path)))


def test_cli_success_prints_one_summary_line(packed):
    path = packed("blob")
    result = CliRunner().invoke(cli, ["verify", str(path)])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines() == [f"{path}: OK (blob; 18 of 18 samples checked, checksums matched; " + result.output.split("; ")[-1].strip()]


def test_quick_on_raw_samples_says_every_check_ran(packed):
    """--quick skips decoding jpeg/png; on raw samples it said nothing, as if something were skipped."""
    result = CliRunner().invoke(cli, ["verify", str(packed("blob")), "--quick"])
    assert result.exit_code == 0 and result.output.splitlines()[0] == (
        "note: --quick skips decoding jpeg/png samples; these are raw (image), so every check ran"), result.output


def test_source_comparison_finds_a_changed_input(packed, image_folder, tmp_path):
    path = packed("lmdb")
    assert verify(path, source=image_folder, workers=1).compared == 18
    changed = tmp_path / "changed"
    shutil.copytree(image_folder, changed)
    files = sorted(p for p in changed.rglob("*") if p.is_file())
    shutil.copyfile(files[0], files[VICTIM])  # another picture under the same name
    report = verify(path, source=changed, workers=1)
    assert [f.where for f in report.faults] == [f"sample {VICTIM} <- {files[VICTIM].relative_to(changed)}"]
    assert "raw pixels differ" in report.faults[0].message


def test_source_comparison_does_not_repeat_the_conversions_advice(image_folder, tmp_path, caplog):
    """verify --source printed convert's enlargement warning again, unlabelled, among its own
    lines (a data engineer's walkthrough)."""
    dst = convert(image_folder, tmp_path / "big.blob", image=ImageOptions(size=256), workers=1).dst
    assert any("smaller than" in r.getMessage() for r in caplog.records)  # the conversion's advice, once
    caplog.clear()
    assert verify(dst, source=image_folder, workers=1).ok
    assert not [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_a_truncated_dataset_is_a_fault_not_a_crash(packed):
    path = packed("blob")
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size - 10)
    report = verify(path)
    assert not report.ok and report.faults[0].where == "dataset" and "truncated" in report.faults[0].message


def test_every_damaged_shard_is_named_not_only_the_first(packed, tmp_path):
    """verify named the first truncated shard only (a Streaming user's walkthrough): one line
    now names each missing or truncated one."""
    copy = tmp_path / "shards"
    shutil.copytree(packed("webdataset"), copy)
    first, *_, last = sorted(copy.glob("shard-*.tar"))
    with open(first, "r+b") as handle:
        handle.truncate(first.stat().st_size - 512)
    last.unlink()
    report = verify(copy)
    assert not report.ok and [f.where for f in report.faults] == ["dataset"]
    message = report.faults[0].message
    assert message.startswith("2 of ") and f"{first}: shard has" in message and f"{last}: shard is missing" in message, message


def test_a_truncated_lmdb_is_one_line_not_sigbus(packed):
    """An LMDB copy cut short: its map reaches past the file's end, and reading there killed the
    process with SIGBUS (in a subprocess here, so that a regression cannot take pytest down)."""
    import subprocess
    import sys

    data = packed("lmdb") / "data.mdb"
    with open(data, "r+b") as handle:
        handle.truncate(data.stat().st_size // 2)
    script = (
        "import sys\n"
        "from readers import open_dataset\n"
        "from readers.schema import IncompleteDatasetError\n"
        "from packer.verify import verify\n"
        "try:\n    open_dataset(sys.argv[1])\nexcept IncompleteDatasetError as exc:\n    print('refused:', exc)\n"
        "print('fault:', verify(sys.argv[1]).faults[0].message)\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(data.parent)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    refused, fault = result.stdout.splitlines()
    assert refused.startswith("refused: ") and "truncated: data.mdb has" in refused and "convert it again" in refused
    assert fault.startswith("fault: ") and "truncated" in fault


def _edit_source(image_folder: Path, source: Path) -> tuple[list[Path], Path, Path, Path]:
    """A copy of the source with one input removed, one changed and one added."""
    shutil.copytree(image_folder, source)
    files = sorted(p for p in source.rglob("*") if p.is_file())
    removed, changed = files[3], files[VICTIM + 4]  # class_00 and class_01
    added = source / "class_02" / "added.jpg"
    shutil.copyfile(files[0], added)  # a new input
    shutil.copyfile(files[1], changed)  # another picture under the same name
    removed.unlink()
    return files, removed, changed, added


def _drop_source_names(path: Path, fmt: str) -> None:
    """Make ``path`` look written before samples recorded their source names (each format's structure removed)."""
    if fmt == "lmdb":
        env = lmdb.open(str(path), subdir=True, lock=False)
        with env.begin(write=True) as txn:
            assert txn.delete(SOURCES_KEY)
        env.close()
    elif fmt == "hdf5":
        with h5py.File(path, "r+") as file:
            del file[SOURCES]
    elif fmt == "webdataset":
        (path / SOURCES_FILE).unlink()
    else:
        with open(path, "r+b") as handle:
            handle.seek(HEADER.size)
            handle.write(bytes(SOURCES_HEADER.size))
    assert open_store(path).source_names() is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_source_comparison_names_exactly_the_changed_added_and_removed_inputs(fmt, packed, image_folder, tmp_path):
    """Matched by the source name each sample records: one deleted input is one fault naming it,
    and no later sample shifts onto the wrong file."""
    path = packed(fmt)
    source = tmp_path / "edited"
    files, removed, changed, added = _edit_source(image_folder, source)
    rel = lambda p: str(p.relative_to(source))  # noqa: E731
    store = open_store(path)
    assert store.source_names() == [rel(f) for f in files] and store.source_name(3) == rel(removed)
    report = verify(path, source=source, workers=1)
    assert sorted(f.message for f in report.faults if f.where.startswith("sample 3")) == [
        f"removed from the source: {rel(removed)} is no longer among its inputs"
    ], report.faults
    assert [str(f) for f in report.faults if f.where.startswith("source")] == [f"source {rel(added)}: added: not in the dataset"]
    [change] = [f for f in report.faults if f.where.endswith(f" <- {rel(changed)}")]
    assert change.where.startswith(f"sample {VICTIM + 4}") and change.message.startswith("changed: raw pixels differ")
    assert report.fault_count == 3 and report.compared == len(files) - 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_dataset_without_source_names_is_matched_by_content(fmt, packed, image_folder, tmp_path):
    """Written before names were recorded: still verifies, and --source matches by content in
    scan order (the removed input is located, not named)."""
    path = packed(fmt)
    _drop_source_names(path, fmt)
    assert verify(path).ok
    source = tmp_path / "edited"
    files, removed, changed, added = _edit_source(image_folder, source)
    report = verify(path, source=source, workers=1)
    rel = lambda p: str(p.relative_to(source))  # noqa: E731
    assert sorted(re.sub(r" \(shard-\d+\.tar\)", "", str(f)) for f in report.faults if f.where.startswith("sample 3")) == [
        "sample 3: removed from the source: no input gives this sample (it was after "
        f"{rel(files[2])} in scan order)"
    ], report.faults
    assert any(f.where.endswith(rel(changed)) and f.message.startswith("changed: raw pixels differ") for f in report.faults)
    assert f"source {rel(added)}: added: not in the dataset" in [str(f) for f in report.faults]
    assert report.fault_count == 3 and report.compared == len(files) - 1


def test_verify_source_through_the_cli_counts_three_faults(packed, image_folder, tmp_path):
    path = packed("hdf5")
    source = tmp_path / "edited"
    _edit_source(image_folder, source)
    result = CliRunner().invoke(cli, ["verify", str(path), "--source", str(source)])
    assert result.exit_code == 1
    assert [line.split(": ", 1)[0] for line in result.output.splitlines()].count("fault") == 3, result.output


def test_verify_source_prints_the_scans_warnings_as_convert_does(image_folder, tmp_path):
    """An empty class folder: convert says "warning: class folder 'e' has no images", verify
    --source printed the bare message through logging's default handler (a walkthrough)."""
    source = tmp_path / "src"
    shutil.copytree(image_folder, source)
    (source / "zz_empty").mkdir()
    dst = tmp_path / "out.h5"
    convert(source, dst, image=ImageOptions(size=8), workers=1)
    result = CliRunner().invoke(cli, ["verify", str(dst), "--source", str(source)])
    assert result.exit_code == 0, result.output
    assert "warning: class folder 'zz_empty' has no images (its label is kept)" in result.stderr
    assert not any(line.startswith("class folder") for line in result.stderr.splitlines())


def _edit_meta(path: Path, edit) -> None:
    import json

    meta = path / "packer.json"
    record = json.loads(meta.read_text())
    edit(record)
    meta.write_text(json.dumps(record))


def test_metadata_edits_a_reader_relies_on_are_faults(image_folder, tmp_path):
    """Found by a commands walkthrough, each passed verify: a WebDataset whose metadata says no
    checksums beside its checksum file (its damaged pixels then passed), per-shard counts that
    disagree with the index (StreamingShards plans ranks by them: one rank came up short), and a
    preprocessing size that is not the samples'. A wrong 'count' now says so."""
    path = _convert(image_folder, tmp_path / "a.shards", "webdataset")
    file, offset = _payload_location(path, "webdataset", VICTIM)
    _flip(file, offset + 100)
    _edit_meta(path, lambda r: r.update(checksum=""))
    report = verify(path)
    assert not report.ok and "says no checksums are stored, but packer-crc32.npy is there" in str(report.faults), report.faults
    path = _convert(image_folder, tmp_path / "b.shards", "webdataset")
    _edit_meta(path, lambda r: r["extra"].update(shard_counts=[5, 5, 6, 2]))  # 18 samples: 5, 5, 5, 3
    report = verify(path)
    assert [(f.where, f.message) for f in report.faults] == [
        ("wids-index.json", "does not list the metadata's shards, sample counts and sizes: convert again"),  # (written from the counts)
        ("shard shard-000002.tar", "the metadata says it holds 6 samples, the index 5"),
        ("shard shard-000003.tar", "the metadata says it holds 2 samples, the index 3")], report.faults
    path = _convert(image_folder, tmp_path / "e.shards", "webdataset")
    _edit_meta(path, lambda r: r.update(checksums_sha256="0" * 64))  # (what resume states name the dataset by)
    assert [(f.where, f.message) for f in verify(path).faults] == [("checksums", "their SHA-256 is not the metadata's checksums_sha256: "
                                                                    "the stored checksums (or the record) changed after writing")]
    path = _convert(image_folder, tmp_path / "c.shards", "webdataset")
    _edit_meta(path, lambda r: r.update(count=17))
    assert "metadata 'count' is 17, its shards' sample counts add up to 18" in str(verify(path).faults)
    path = _convert(image_folder, tmp_path / "d.blob", "blob")
    blob = open_store(path)
    assert blob.meta.preprocessing["size"] == [16, 16]
    raw = path.read_bytes()
    start = raw.index(b'"size": [')  # (the blob's metadata JSON, edited in place: 16 -> 32 keeps its length)
    path.write_bytes(raw[:start] + raw[start:start + 60].replace(b"16", b"32", 2) + raw[start + 60:])
    report = verify(path)
    assert ("metadata", "its preprocessing says size [32, 32] (center-crop), its samples are 16x16") in [
        (f.where, f.message) for f in report.faults], report.faults


def test_files_packer_did_not_write_are_said(image_folder, tmp_path):
    """A stray shard-named .tar in a shard folder is a fault (a pattern over the folder reads it);
    another file in a dataset's folder is a note (verify said nothing of either)."""
    shards = _convert(image_folder, tmp_path / "a.shards", "webdataset")
    shutil.copy(shards / "shard-000000.tar", shards / "shard-000004.tar")
    report = verify(shards)
    assert [(f.where, f.message[:40]) for f in report.faults] == [("shard-000004.tar", "a .tar packer did not write, among the s")]
    folder = _convert(image_folder, tmp_path / "b.lmdb", "lmdb")
    (folder / "README.txt").write_text("my notes")
    result = CliRunner().invoke(cli, ["verify", str(folder)])
    assert result.exit_code == 0 and result.stdout.startswith(
        f"note: {folder} also holds files packer did not write (README.txt): readers ignore them"), result.output


def test_verify_names_an_index_entry_that_no_longer_covers_its_tar_member(tmp_path):
    """The index-against-member fault, which no test asserted (a mutation sweep)."""
    import packer
    from packer import ImageOptions
    from packer.samples import make_image_folder
    from readers.formats import open_store
    from readers.formats.webdataset import INDEX_FILE

    src = make_image_folder(tmp_path / "img", classes=2, per_class=2, size=(20, 20))
    packer.convert(src, tmp_path / "out", format="webdataset", image=ImageOptions(size=(8, 8), resize_mode="stretch"))
    index = np.load(tmp_path / "out" / INDEX_FILE)
    index[1, 2] -= 64  # sample 1's nbytes: its payload now ends before its member does
    np.save(tmp_path / "out" / INDEX_FILE, index)
    faults = list(open_store(tmp_path / "out").structure_faults())
    assert any(what.startswith("the index puts its payload at") for _where, what in faults), faults
