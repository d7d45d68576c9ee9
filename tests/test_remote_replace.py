"""A WebDataset at a URL replaced with --overwrite (moto's S3 on 127.0.0.1, and file://): the
new dataset is stored at URL.partial and copied over once whole, so the old one stays readable
until then and stays whole when the run fails or is killed; an upload in progress holds a
marker object, and readers given its shards by a brace pattern refuse them."""

from __future__ import annotations

import shutil

import fsspec
import numpy as np
import pytest

import packer.parallel as parallel
from packer import ImageOptions, StorageOptions, convert
from packer.errors import OutputError
from packer.remote import staging_folder
from readers.formats.uploading import UPLOAD_MARKER
from readers.schema import IncompleteDatasetError
from readers.webdataset import StreamingShards
from checkpoints import convert_until_checkpoint, inputs_converted
from test_remote import assert_same_output

OLD = dict(format="webdataset", image=ImageOptions(size=12), storage=StorageOptions(shard_size=2), workers=1)
NEW = dict(format="webdataset", image=ImageOptions(size=8), storage=StorageOptions(shard_size=8), workers=1)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """60 tiny JPEGs in 2 classes."""
    from packer.samples import make_image_folder

    return make_image_folder(tmp_path_factory.mktemp("replace") / "src", classes=2, per_class=30, size=(12, 16))


def files(fs, root: str) -> dict[str, bytes]:
    """Every file at ``root`` and its bytes ({} when there is nothing)."""
    fs.invalidate_cache()
    return {p.rsplit("/", 1)[-1]: fs.cat(p) for p in fs.ls(root, detail=False)} if fs.exists(root) else {}


def read_all(url: str) -> list[tuple[tuple[int, ...], int]]:
    """(shape, label) of every sample StreamingShards reads at ``url``, in order."""
    return [(tuple(image.shape), int(label)) for image, label in StreamingShards(url)]


def failing_after(monkeypatch, pieces: int, check) -> None:
    """Make the WebDataset writer fail as its piece ``pieces + 1`` arrives (``pieces`` shards
    stored by then), after calling ``check(writer)``."""
    from packer.writers import webdataset as wds

    real_add, calls = wds.ShardWriter.add_piece, []

    def failing_add(self, result):
        calls.append(1)
        if len(calls) == pieces + 1:
            self.sink.flush()
            check(self)
            raise RuntimeError("disk on fire")
        return real_add(self, result)

    monkeypatch.setattr(wds.ShardWriter, "add_piece", failing_add)


def test_a_failed_overwrite_leaves_the_dataset_it_would_replace(s3, images, monkeypatch):
    """--overwrite removed the old shards before converting, so a run that failed left neither
    dataset. Now the new one is stored at URL.partial, with the marker, while the old one stays
    readable; the failure removes URL.partial and nothing else."""
    url = "s3://packer-test/kept"
    shutil.rmtree(staging_folder(url), ignore_errors=True)  # (machine-wide: an earlier run's journal)
    convert(images, url, **OLD)
    before, samples = files(s3, "packer-test/kept"), read_all(url)
    assert len(samples) == 60 and samples[0][0] == (3, 12, 12)
    seen = {}

    def check(writer):
        seen["staged"] = sorted(files(s3, "packer-test/kept.partial"))
        seen["old"] = files(s3, "packer-test/kept") == before and read_all(url) == samples
        with pytest.raises(IncompleteDatasetError, match=f"unfinished upload by packer .it holds {UPLOAD_MARKER}"):
            StreamingShards("s3://packer-test/kept.partial/shard-{000000..000001}.tar")

    failing_after(monkeypatch, 2, check)
    with pytest.raises(RuntimeError, match="disk on fire"):
        convert(images, url, overwrite=True, **NEW)
    assert seen == {"staged": [UPLOAD_MARKER, "shard-000000.tar", "shard-000001.tar"], "old": True}
    assert files(s3, "packer-test/kept") == before and read_all(url) == samples
    assert not s3.exists("packer-test/kept.partial") and not staging_folder(url).exists()


def test_a_fresh_upload_holds_the_marker_until_its_metadata(s3, images, monkeypatch):
    """An unfinished upload has no metadata record, and neither do foreign shards: StreamingShards
    took a brace pattern over it, and read whatever shards were there. The marker tells them apart."""
    url = "s3://packer-test/fresh"
    shutil.rmtree(staging_folder(url), ignore_errors=True)  # (machine-wide: an earlier run's journal)
    seen = []

    def check(writer):
        seen.append(sorted(files(s3, "packer-test/fresh")))
        with pytest.raises(IncompleteDatasetError, match="s3://packer-test/fresh: an unfinished upload by packer"):
            StreamingShards("s3://packer-test/fresh/shard-{000000..000001}.tar")
        with pytest.raises(IncompleteDatasetError, match="unfinished upload by packer"):
            StreamingShards(url)

    failing_after(monkeypatch, 2, check)
    with pytest.raises(RuntimeError, match="disk on fire"):
        convert(images, url, **NEW)
    assert seen == [[UPLOAD_MARKER, "shard-000000.tar", "shard-000001.tar"]]
    monkeypatch.undo()
    convert(images, url, **NEW)
    assert UPLOAD_MARKER not in files(s3, "packer-test/fresh") and len(read_all("s3://packer-test/fresh/shard-{000000..000007}.tar")) == 60


@pytest.mark.parametrize("scheme", ["s3", "file"])
def test_an_overwrite_leaves_exactly_the_new_dataset(s3, images, tmp_path, scheme):
    """Thirty old shards replaced by eight: the folder then holds what a local conversion writes,
    byte for byte (no old shard, no marker), and no URL.partial is left."""
    url = "s3://packer-test/replaced" if scheme == "s3" else f"file://{tmp_path / 'replaced'}"
    fs, root = (s3, "packer-test/replaced") if scheme == "s3" else fsspec.core.url_to_fs(url)
    shutil.rmtree(staging_folder(url), ignore_errors=True)  # (machine-wide: an earlier run's journal)
    convert(images, url, **OLD)
    assert len(files(fs, root)) == 30 + 5
    convert(images, url, overwrite=True, **NEW)
    local = convert(images, tmp_path / "local", **NEW)
    assert_same_output(fs, root, local.dst)
    assert not fs.exists(f"{root}.partial") and not staging_folder(url).exists()


def test_a_publish_cut_short_is_done_again_by_resume(s3, images, monkeypatch):
    """The store fails while the new dataset is copied over the old one: the error says --resume
    publishes it again, readers refuse the half-replaced folder (one line), and --resume copies
    it over whole without converting anything again."""
    import packer.remote as remote

    url = "s3://packer-test/cut"
    shutil.rmtree(staging_folder(url), ignore_errors=True)  # (machine-wide: an earlier run's journal)
    convert(images, url, **OLD)
    real_copy, copies = s3.copy, []

    def copy_then_fail(path1, path2, **kwargs):
        copies.append(path1)
        if len(copies) == 2:  # the shards went over; the metadata record does not
            raise ConnectionError("connection reset by peer")
        return real_copy(path1, path2, **kwargs)

    monkeypatch.setattr(remote, "dst_filesystem", lambda u: (s3, u.split("://", 1)[1]))
    monkeypatch.setattr(s3, "copy", copy_then_fail)
    with pytest.raises(OutputError, match=r"^s3://packer-test/cut.partial: publishing the upload failed .*--resume publishes it again"):
        convert(images, url, overwrite=True, **NEW)
    monkeypatch.undo()
    assert UPLOAD_MARKER in files(s3, "packer-test/cut") and "packer.json" not in files(s3, "packer-test/cut")
    assert "packer.json" in files(s3, "packer-test/cut.partial")
    for given in (url, "s3://packer-test/cut/shard-{000000..000007}.tar"):
        with pytest.raises(IncompleteDatasetError, match="unfinished upload by packer"):
            StreamingShards(given)
    with inputs_converted(monkeypatch, parallel) as sizes:
        convert(images, url, resume=True, **NEW)
    assert sum(sizes) == 0
    s3.invalidate_cache()
    assert len(read_all(url)) == 60 and not s3.exists("packer-test/cut.partial") and not staging_folder(url).exists()


def test_a_killed_overwrite_keeps_the_old_dataset_and_resumes_beside_it(s3, tmp_path, monkeypatch):
    """SIGKILL after a checkpoint of an --overwrite: the old dataset is whole and readable; a run
    without flags says --resume carries on the new one; --resume converts only the inputs after
    the checkpoint and the result equals a local conversion's."""
    from imagefiles import jpeg_bytes, write
    from packer.samples import natural_image

    src = tmp_path / "src"
    data = jpeg_bytes(natural_image(np.random.default_rng(0), 375, 500), quality=90)
    for i in range(240):
        write(src / f"c{i % 2}" / f"{i:04d}.jpg", data)
    url = "s3://packer-test/killed"
    shutil.rmtree(staging_folder(url), ignore_errors=True)  # (machine-wide: an earlier run's journal)
    convert(src, url, format="webdataset", image=ImageOptions(size=8), workers=1)
    before = files(s3, "packer-test/killed")
    journal = staging_folder(url) / "killed.partial-journal" / "journal.json"
    args = ["convert", str(src), url, "-j", "1", "-q", "--size", "24", "-f", "webdataset", "--shard-size", "20", "--overwrite"]
    committed = convert_until_checkpoint(args, journal)
    assert 0 < committed < 240
    assert files(s3, "packer-test/killed") == before and len(read_all(url)) == 240
    assert UPLOAD_MARKER in files(s3, "packer-test/killed.partial")
    with pytest.raises(OutputError, match=r"killed.partial; --resume carries it on, --overwrite starts over"):
        convert(src, url, format="webdataset")

    kwargs = dict(format="webdataset", image=ImageOptions(size=24), storage=StorageOptions(shard_size=20), workers=1)
    with inputs_converted(monkeypatch, parallel) as sizes:
        convert(src, url, resume=True, **kwargs)
    assert sizes == [240 - committed]
    reference = convert(src, tmp_path / "ref.shards", **kwargs)
    assert_same_output(s3, "packer-test/killed", reference.dst)
    s3.invalidate_cache()
    assert not s3.exists("packer-test/killed.partial") and not staging_folder(url).exists()


def test_a_folder_beside_the_url_that_is_not_packers_is_left(s3, images):
    """URL.partial holding a user's objects is neither used nor removed by an --overwrite."""
    url = "s3://packer-test/beside"
    shutil.rmtree(staging_folder(url), ignore_errors=True)  # (machine-wide: an earlier run's journal)
    convert(images, url, **OLD)
    s3.pipe({"packer-test/beside.partial/notes.txt": b"mine"})
    with pytest.raises(OutputError, match=r"s3://packer-test/beside.partial is there and is not packer's"):
        convert(images, url, overwrite=True, **NEW)
    assert s3.cat("packer-test/beside.partial/notes.txt") == b"mine" and len(read_all(url)) == 60
