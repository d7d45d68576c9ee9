"""``--resume`` of the sources that are not a class folder: a label file, a .tar, a .tar.gz, a
tar of tars and a Python dataset. Each conversion is SIGKILLed (it and its workers) soon after
its first checkpoint, then resumed: only the remaining inputs are converted, and the LMDB (read
with lmdb itself) is byte-identical to an uninterrupted run's."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import lmdb
import numpy as np
import pytest

import packer.parallel
from checkpoints import CHILD, convert_until_checkpoint, inputs_converted
from imagefiles import jpeg_bytes, write
from packer import ImageOptions, SourceOptions, convert
from packer.samples import natural_image
from packer.writers.journal import journal_path
from readers.formats.lmdb import SOURCES_KEY
from test_labels import lmdb_samples

COUNT = 240
BROKEN = 77  # not a JPEG: skipped, and the skip must survive the resume
CLASSES = ("ant", "bee", "cow")
HERE = Path(__file__).resolve().parent


def _pictures() -> list[bytes]:
    rng = np.random.default_rng(3)
    return [jpeg_bytes(natural_image(rng, 375, 500, k, 4), quality=90) for k in range(4)]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, tuple[Path, SourceOptions | None]]:
    """The same 240 JPEGs (3 classes, one broken) as each kind of SRC."""
    root = tmp_path_factory.mktemp("resume-sources")
    pictures = _pictures()
    files = []
    for i in range(COUNT):
        data = b"not a jpeg" if i == BROKEN else pictures[i % 4]
        files.append((CLASSES[i % 3], f"{i:04d}.jpg", data))
    rows = ["path,label"]
    for cls, name, data in files:
        write(root / "flat" / name, data)
        rows.append(f"{name},{cls}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    members = [(f"train/{cls}/{name}", data) for cls, name, data in files]
    (root / "train.tar").write_bytes(_tar(members))
    with tarfile.open(root / "train.tar.gz", "w:gz", compresslevel=1) as tar:
        for name, data in members:
            _add(tar, name, data)
    inner = [(f"{cls}.tar", _tar([(name, data) for c, name, data in files if c == cls])) for cls in CLASSES]
    (root / "imagenet.tar").write_bytes(_tar(inner))
    return {
        "labels": (root / "flat", SourceOptions(labels=str(root / "labels.csv"))),
        "tar": (root / "train.tar", None),
        "tar.gz": (root / "train.tar.gz", None),
        "tar of tars": (root / "imagenet.tar", None),
    }


def _raw(path: Path, key: bytes) -> bytes | None:
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=path.is_dir())
    try:
        with env.begin() as txn:
            return txn.get(key)
    finally:
        env.close()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _tar(files: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files:
            _add(tar, name, data)
    return buffer.getvalue()


def _same(dst: Path, reference: Path) -> None:
    rows, meta = lmdb_samples(dst)
    ref_rows, ref_meta = lmdb_samples(reference)
    assert _raw(dst, SOURCES_KEY) == _raw(reference, SOURCES_KEY)  # each sample's source name too
    meta.pop("created"), ref_meta.pop("created")
    assert rows == ref_rows and meta == ref_meta
    assert meta["count"] == COUNT - 1 and [s["path"] for s in meta["skipped"]] == [s["path"] for s in ref_meta["skipped"]]


@pytest.mark.parametrize("kind", ["labels", "tar", "tar.gz", "tar of tars"])
def test_sigkill_then_resume_of_an_archive_or_label_file(sources, tmp_path, monkeypatch, kind):
    src, source = sources[kind]
    dst = tmp_path / "out.lmdb"
    args = ["convert", str(src), str(dst), "--size", "24", "-j", "1", "-q"]
    if source is not None:
        args += ["--labels", source.labels]
    saved = convert_until_checkpoint(args, journal_path(dst.with_name("out.lmdb.partial")) / "journal.json")
    assert 0 < saved < COUNT  # killed in the middle, not before its first checkpoint nor after the end
    assert not dst.exists()
    options = {"image": ImageOptions(size=24), "source": source}
    with inputs_converted(monkeypatch, packer.parallel) as converted:
        report = convert(src, dst, workers=2, resume=True, **options)
    assert sum(converted) == COUNT - saved and report.resumed == saved
    reference = convert(src, tmp_path / "ref.lmdb", workers=2, **options)
    assert report.written == reference.written == COUNT - 1
    _same(dst, reference.dst)


class SlowDataset:
    """240 ``(HWC uint8 array, label)`` pairs, a few ms each (so a kill lands mid-way); pickles."""

    classes = list(CLASSES)

    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, index: int):
        time.sleep(0.004)
        if index == BROKEN:
            return np.zeros((0, 5, 3), np.uint8), 0  # an empty picture: skipped
        return natural_image(np.random.default_rng(index), 60, 80, index % 3, 3), index % 3


def test_sigkill_then_resume_of_a_python_dataset(tmp_path, monkeypatch):
    dst = tmp_path / "out.lmdb"
    journal = journal_path(dst.with_name("out.lmdb.partial")) / "journal.json"
    child = CHILD.split("; from packer.cli")[0] + (
        f"; sys.path.insert(0, {str(HERE)!r}); from test_resume_sources import SlowDataset; import packer; "
        f"packer.convert(SlowDataset(), {str(dst)!r}, image=packer.ImageOptions(size=24), workers=1)"
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 60
    while not journal.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.005)
    time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    saved = json.loads(journal.read_text())["inputs"]
    assert 0 < saved < COUNT and not dst.exists()
    with inputs_converted(monkeypatch, packer.parallel) as converted:
        report = convert(SlowDataset(), dst, image=ImageOptions(size=24), workers=2, resume=True)
    assert sum(converted) == COUNT - saved and report.resumed == saved
    reference = convert(SlowDataset(), tmp_path / "ref.lmdb", image=ImageOptions(size=24), workers=2)
    assert report.written == reference.written == COUNT - 1
    _same(dst, reference.dst)
