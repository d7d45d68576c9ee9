"""Archives as SRC through the CLI: .tar, .tar.gz, .zip and an ImageNet-style tar of tars give the
class folder's samples byte for byte (read back with lmdb itself); unsafe members are refused;
WebDataset shards keep their labels; resume notices a changed archive."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path

import lmdb
import pytest
from click.testing import CliRunner

from packer import ImageOptions
from packer.cli import cli
from packer.jobs import image_job
from readers.formats.lmdb import SOURCES_KEY
from test_labels import lmdb_samples, run


@pytest.fixture(scope="module")
def reference(image_folder: Path, tmp_path_factory: pytest.TempPathFactory):
    dst = tmp_path_factory.mktemp("ref") / "ref.lmdb"
    assert run(image_folder, dst).exit_code == 0
    return lmdb_samples(dst)


def tar_bytes(files: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def class_files(folder: Path) -> list[tuple[str, bytes]]:
    """(class/name, bytes) of every image, in reverse order: an archive's order does not matter."""
    return [(p.relative_to(folder).as_posix(), p.read_bytes()) for p in sorted(folder.rglob("*.jpg"), reverse=True)]


def make_archives(folder: Path, where: Path) -> dict[str, Path]:
    files = class_files(folder)
    made = {"tar": where / "train.tar", "tar.gz": where / "train.tar.gz", "zip": where / "train.zip", "tar of tars": where / "imagenet.tar"}
    made["tar"].write_bytes(tar_bytes([(f"train/{name}", data) for name, data in files]))  # one top folder, looked through
    with tarfile.open(made["tar.gz"], "w:gz") as tar:
        for name, data in files:
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with zipfile.ZipFile(made["zip"], "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files:
            zf.writestr(name, data)
        zf.writestr("__MACOSX/class_00/._img.jpg", b"resource fork")
    inner = {}
    for name, data in files:
        cls, base = name.split("/")
        inner.setdefault(cls, []).append((base, data))
    made["tar of tars"].write_bytes(tar_bytes([(f"{cls}.tar", tar_bytes(members)) for cls, members in sorted(inner.items(), reverse=True)]))
    return made


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "zip", "tar of tars"])
def test_an_archive_converts_to_the_class_folder_bytes(image_folder, reference, tmp_path, kind):
    archive = make_archives(image_folder, tmp_path)[kind]
    dst = tmp_path / "out.lmdb"
    result = CliRunner().invoke(cli, ["convert", str(archive), str(dst), "--size", "16", "-j", "2", "-q"])
    assert result.exit_code == 0, result.output
    samples, meta = lmdb_samples(dst)
    assert samples == reference[0]
    assert meta["classes"] == reference[1]["classes"] and meta["skipped"] == []
    assert meta["source"] == str(archive.resolve())


def test_unsafe_members_and_links_are_refused(image_folder, tmp_path):
    files = class_files(image_folder)
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name, data in files:
            zf.writestr(name, data)
        zf.writestr("../evil.jpg", files[0][1])
        zf.writestr("/etc/abs.jpg", files[0][1])
        zf.writestr("class_00/../../up.jpg", files[0][1])
    dst = tmp_path / "out.lmdb"
    result = run(archive, dst)
    assert result.exit_code == 0, result.output
    samples, meta = lmdb_samples(dst)
    assert len(samples) == len(files)
    refused = {entry["path"]: entry["reason"] for entry in meta["skipped"]}
    assert set(refused) == {"../evil.jpg", "/etc/abs.jpg", "class_00/../../up.jpg"}
    assert all("refused" in reason for reason in refused.values())
    assert not (tmp_path.parent / "evil.jpg").exists() and not (tmp_path / "evil.jpg").exists()

    linked = tmp_path / "links.tar"
    with tarfile.open(linked, "w") as tar:
        tar.add(image_folder / "class_00", arcname="class_00")
        info = tarfile.TarInfo("class_01/link.jpg")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    result = run(linked, tmp_path / "links.lmdb")
    assert result.exit_code == 0, result.output
    _, meta = lmdb_samples(tmp_path / "links.lmdb")
    assert [(s["path"], s["reason"]) for s in meta["skipped"]] == [("class_01/link.jpg", "a link inside the archive; not followed")]
    assert meta["classes"] == ["class_00", "class_01"]  # a refused member is skipped; its folder keeps its class, as a folder's does

    zipped = tmp_path / "links.zip"  # a zip made with `zip -y` stores a symlink as a member whose Unix mode says so
    with zipfile.ZipFile(zipped, "w") as archive:
        for path in sorted((image_folder / "class_00").iterdir()):
            archive.write(path, f"class_00/{path.name}")
        info = zipfile.ZipInfo("class_01/link.jpg")
        info.create_system, info.external_attr = 3, (0o120777 << 16)
        archive.writestr(info, "../class_00/img_00000.jpg")
    result = run(zipped, tmp_path / "zlinks.lmdb")
    assert result.exit_code == 0, result.output
    _, meta = lmdb_samples(tmp_path / "zlinks.lmdb")  # it was "not a readable image (cannot identify image file)"
    assert [(s["path"], s["reason"]) for s in meta["skipped"]] == [("class_01/link.jpg", "a link inside the archive; not followed")]


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_a_member_named_twice_and_a_device_or_fifo_member_are_recorded(image_folder, tmp_path, suffix):
    """Both were left out without a word, the earlier of two members of one name replaced by the
    later one (a data-safety walkthrough): a folder's FIFO named like an image was recorded, not theirs."""
    files = class_files(image_folder)
    archive = tmp_path / f"odd{suffix}"
    with tarfile.open(archive, "w:gz" if suffix == ".tar.gz" else "w") as tar:
        for name, data in [("class_00/x.jpg", files[0][1]), ("class_01/c.jpg", files[0][1]), ("class_01/c.jpg", files[1][1])]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, kind in [("class_00/dev.jpg", tarfile.CHRTYPE), ("class_00/fifo.jpg", tarfile.FIFOTYPE)]:
            info = tarfile.TarInfo(name)
            info.type = kind
            tar.addfile(info)
    result = run(archive, tmp_path / "o.lmdb")
    assert result.exit_code == 0, result.output
    samples, meta = lmdb_samples(tmp_path / "o.lmdb")
    assert [(s["path"], s["reason"]) for s in meta["skipped"]] == [
        ("class_00/dev.jpg", "not a regular file (a device or FIFO member)"),
        ("class_00/fifo.jpg", "not a regular file (a device or FIFO member)"),
        ("class_01/c.jpg", "member 2 of 3: the archive holds this name again later, and the last one is converted (as tar -x leaves it)")]
    alone = tmp_path / "alone.tar"  # the one converted is the last, as tar -x leaves it
    with tarfile.open(alone, "w") as tar:
        for name, data in [("class_00/x.jpg", files[0][1]), ("class_01/c.jpg", files[1][1])]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert run(alone, tmp_path / "alone.lmdb").exit_code == 0
    assert samples == lmdb_samples(tmp_path / "alone.lmdb")[0] and len(samples) == 2


def test_damaged_and_unreadable_archives_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    result = run(bad, tmp_path / "a.lmdb")
    assert result.exit_code == 1 and result.output.startswith("Error: ") and "cannot read the archive" in result.output
    result = run(tmp_path / "missing.tar", tmp_path / "b.lmdb")
    assert result.exit_code == 1 and "no such archive" in result.output


def test_webdataset_shards_are_repacked_with_their_labels(image_folder, reference, tmp_path):
    shards = tmp_path / "old.shards"
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(shards), "-f", "webdataset", "--size", "16", "--shard-size", "5", "-j", "1", "-q"])
    assert result.exit_code == 0, result.output
    dst = tmp_path / "new.lmdb"
    assert run(shards, dst).exit_code == 0  # raw (C, H, W) .npy payloads at the same size: the same pixels
    samples, meta = lmdb_samples(dst)
    assert samples == reference[0] and meta["classes"] == reference[1]["classes"]
    assert meta["skipped"] == []

    plain = tmp_path / "plain"  # shards another tool wrote: KEY.jpg + KEY.cls
    plain.mkdir()
    files = class_files(image_folder)[::-1]
    members = []
    for i, (name, data) in enumerate(files):
        members += [(f"s{i:04d}.jpg", data), (f"s{i:04d}.cls", str(int(name[7])).encode())]
    members += [("s9999.cls", b"1"), ("s9998.jpg", files[0][1]), ("s9998.cls", b"cat")]
    (plain / "shard-000000.tar").write_bytes(tar_bytes(members[:10]))
    (plain / "shard-000001.tar").write_bytes(tar_bytes(members[10:]))
    dst = tmp_path / "plain.lmdb"
    assert run(plain, dst).exit_code == 0
    samples, meta = lmdb_samples(dst)
    assert samples == reference[0]  # shard order here is class order
    assert meta["classes"] == [] and meta["labeled"] is True
    assert [(s["path"], s["reason"][:13]) for s in meta["skipped"]] == [
        ("shard-000001.tar/s9999", "no image memb"), ("shard-000001.tar/s9998", "unknown label")]


def test_resume_fingerprint_covers_the_archive(image_folder, tmp_path):
    archive = make_archives(image_folder, tmp_path)["tar"]
    first = image_job(archive, ImageOptions(size=16)).fingerprint("lmdb", tmp_path / "o.lmdb", {}, "skip")
    assert image_job(archive, ImageOptions(size=16)).fingerprint("lmdb", tmp_path / "o.lmdb", {}, "skip") == first
    data = bytearray(archive.read_bytes())
    data[-3000] ^= 0xFF  # rewritten in place: same size, same listing, new modification time
    archive.write_bytes(bytes(data))
    os.utime(archive, ns=(1, 2))
    assert image_job(archive, ImageOptions(size=16)).fingerprint("lmdb", tmp_path / "o.lmdb", {}, "skip") != first


def test_a_tar_on_ray_gives_the_local_pools_bytes(image_folder, reference, tmp_path):
    """Ray tasks read a .tar's members by offset from the (shared) archive path, as the local
    pool's workers do: the same LMDB, source names included (lmdb itself). (A .tar.gz's members
    travel with their bytes, like any item.)"""
    ray = pytest.importorskip("ray", reason="the Ray executor needs: pip install 'packer[ray]'")
    from packer import convert

    archive = make_archives(image_folder, tmp_path)["tar"]
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")  # loopback only
    try:
        convert(archive, tmp_path / "ray.lmdb", image=ImageOptions(size=16), executor="ray")
    finally:
        if started:
            ray.shutdown()
    local = convert(archive, tmp_path / "local.lmdb", image=ImageOptions(size=16), workers=2)
    samples, meta = lmdb_samples(tmp_path / "ray.lmdb")
    local_samples, local_meta = lmdb_samples(local.dst)
    assert samples == local_samples and len(samples) >= len(reference[0]) > 0
    assert meta["classes"] == local_meta["classes"] == reference[1]["classes"] and meta["count"] == local_meta["count"]
    names = []
    for path in (tmp_path / "ray.lmdb", local.dst):
        env = lmdb.open(str(path), readonly=True, lock=False, subdir=path.is_dir())
        with env.begin() as txn:
            names.append(txn.get(SOURCES_KEY))
        env.close()
    assert names[0] == names[1] is not None


@pytest.mark.parametrize("inflater", ["zlib", "installed"])
def test_a_compressed_tar_streams_as_tarfile_reads_it(image_folder, tmp_path, monkeypatch, inflater):
    """The streaming pass gives tarfile's names and bytes (pax long names, a gzip of two members,
    bzip2, xz), with Python's zlib and with the inflater installed (zlib-ng where present); a
    truncated or damaged .tar.gz is a one-line error."""
    import bz2
    import gzip
    import lzma
    import zlib

    from packer.sources import tarstream

    if inflater == "zlib":
        monkeypatch.setattr(tarstream, "gzip_inflater", lambda: zlib)
    files = [(f"train/{name}", data) for name, data in class_files(image_folder)]
    files.append(("train/class_00/" + "n" * 150 + ".jpg", files[0][1]))  # a pax path (over 100 bytes)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    plain = buffer.getvalue()
    half = len(plain) // 2
    made = {
        "gz": gzip.compress(plain), "two-member.gz": gzip.compress(plain[:half]) + gzip.compress(plain[half:]),
        "bz2": bz2.compress(plain), "xz": lzma.compress(plain),
    }
    expected = [(i.name, tarfile.open(fileobj=io.BytesIO(plain)).extractfile(i.name).read()) for i in tarfile.open(fileobj=io.BytesIO(plain))]
    for suffix, data in made.items():
        path = tmp_path / f"a.tar.{suffix}"
        path.write_bytes(data)
        entries = tarstream.stream_tar(str(path), lambda name: True, lambda held: None)
        assert [(e.name, e.data) for e in entries] == expected, suffix
    truncated = tmp_path / "cut.tar.gz"
    truncated.write_bytes(made["gz"][: len(made["gz"]) // 2])
    damaged = tmp_path / "damaged.tar.gz"
    damaged.write_bytes(made["gz"][:5000] + bytes(200) + made["gz"][5200:])
    for path in (truncated, damaged):
        result = run(path, tmp_path / f"{path.stem}.lmdb")
        assert result.exit_code == 1 and result.output.startswith("Error: ") and "cannot read the archive" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_a_compressed_tar_over_its_memory_share_is_refused_in_one_line(image_folder, tmp_path, monkeypatch):
    """A .tar.gz is held in memory while it converts: over 1/MEMORY_SHARE of the available memory
    it is refused, naming the fix, and the inflating thread is stopped."""
    import threading

    import packer.sources.archives as archives

    archive = make_archives(image_folder, tmp_path)["tar.gz"]
    monkeypatch.setattr(archives, "available_memory", lambda: 4 * 3000)  # room for about one member
    result = run(archive, tmp_path / "o.lmdb")
    assert result.exit_code == 1 and result.output.startswith("Error: ") and "gunzip -k" in result.output, result.output
    assert not any(t.name == "packer-inflate" for t in threading.enumerate())
    assert not (tmp_path / "o.lmdb").exists()


def without_utf8_flags(data: bytes) -> bytes:
    """The zip ``data`` with bit 11 (names are UTF-8) cleared in every local and central header,
    as Info-ZIP's ``zip`` and most Unix tools write UTF-8 names."""
    out = bytearray(data)
    for signature, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = out.find(signature)
        while start >= 0:
            flags = int.from_bytes(out[start + at : start + at + 2], "little") & ~0x800
            out[start + at : start + at + 2] = flags.to_bytes(2, "little")
            start = out.find(signature, start + 4)
    return bytes(out)


def test_a_zip_of_utf8_names_without_the_utf8_flag_keeps_its_names(image_folder, tmp_path):
    """zipfile reads such names as CP437 ('├╝n├»code cl├Ñss'); packer reads them as the UTF-8
    they are, so the classes and source names are the folder's."""
    files = [(f"ünïcode clåss/{name.split('/', 1)[1]}" if name.startswith("class_00/") else name, data) for name, data in class_files(image_folder)]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files:
            archive.writestr(name, data)
    path = tmp_path / "names.zip"
    path.write_bytes(without_utf8_flags(buffer.getvalue()))
    assert any("├" in info.filename for info in zipfile.ZipFile(path).infolist())  # what zipfile itself reads
    folder = image_job(path, ImageOptions(size=8)).folder
    assert folder.classes == sorted({name.split("/")[0] for name, _ in files}) and "ünïcode clåss" in folder.classes
