"""Gaps a mutation sweep of the remote-destination code (URL.partial, the upload marker, the
Uploader's publish/stop/discard) found in tests/test_remote_replace.py and its neighbours (moto's
S3 on 127.0.0.1, and file://). Each test names the mutant or the bug it was seen failing under."""

from __future__ import annotations

import os
import shutil

import pytest

from packer import convert
from packer.errors import OutputError
from packer.remote import staging_folder
from readers.formats.uploading import UPLOAD_MARKER
from readers.schema import IncompleteDatasetError
from readers.webdataset import StreamingShards
from test_remote_replace import NEW, OLD, failing_after, files, read_all


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """20 tiny JPEGs in 2 classes."""
    from packer.samples import make_image_folder

    return make_image_folder(tmp_path_factory.mktemp("gaps") / "src", classes=2, per_class=10, size=(12, 16))


def test_a_finished_dataset_named_like_the_staging_url_is_never_taken(s3, images):
    """Bug: a user's own finished dataset at URL.partial (its name is theirs to choose) was taken
    for an interrupted --overwrite's: --overwrite of URL deleted it, --resume converted into it
    and published it over URL, and a plain run said an --overwrite was interrupted. It holds no
    upload marker: a run that needs no URL.partial leaves it, and --overwrite of a finished
    dataset at URL is refused in one line naming it."""
    url = "s3://packer-test/gaps-named"
    for stale in (url, url + ".partial"):
        shutil.rmtree(staging_folder(stale), ignore_errors=True)
    convert(images, url + ".partial", **OLD)
    theirs = files(s3, "packer-test/gaps-named.partial")
    convert(images, url, resume=True, **NEW)  # (nothing to resume: a fresh conversion at URL)
    assert files(s3, "packer-test/gaps-named.partial") == theirs and len(read_all(url)) == 20
    with pytest.raises(OutputError, match=r"^s3://packer-test/gaps-named: s3://packer-test/gaps-named.partial is there "
                                          r"and is not packer's upload of a new dataset; .*move it, or choose another DST$"):
        convert(images, url, overwrite=True, **OLD)
    assert files(s3, "packer-test/gaps-named.partial") == theirs and read_all(url)[0][0] == (3, 8, 8)
    assert len(read_all(url + ".partial")) == 20 and not staging_folder(url).exists()


@pytest.mark.parametrize("how", ["file-url pattern", "local pattern", "file-url list", "local list", "local folder"])
def test_a_file_url_upload_in_progress_is_refused_however_its_shards_are_named(tmp_path, images, monkeypatch, how):
    """Bug: a file:// DST is uploaded into its final folder, marker first, as an object store's
    is, but only URLs with a network scheme were checked for the marker: its shards, by a brace
    pattern or a list (file:// or the local path), were read as foreign shards mid-upload."""
    folder = tmp_path / "fresh"
    url = f"file://{folder}"
    given = {"file-url pattern": f"{url}/shard-{{000000..000001}}.tar", "local pattern": f"{folder}/shard-{{000000..000001}}.tar",
             "file-url list": [f"{url}/shard-000000.tar"], "local list": [f"{folder}/shard-000000.tar"], "local folder": str(folder)}[how]
    seen = []

    def check(writer):
        seen.append(sorted(os.listdir(folder)))
        with pytest.raises(IncompleteDatasetError, match=f"^{folder}: an unfinished upload by packer .it holds {UPLOAD_MARKER}"):
            StreamingShards(given)

    failing_after(monkeypatch, 2, check)
    with pytest.raises(RuntimeError, match="disk on fire"):
        convert(images, url, **NEW)
    assert seen == [[UPLOAD_MARKER, "shard-000000.tar", "shard-000001.tar"]]


def _marker_deletion_fails(monkeypatch, s3, root: str, times: int) -> None:
    """The store refuses to delete ``root``'s marker ``times`` times (all other calls pass)."""
    import packer.remote as remote

    real, failed = s3.rm_file, []

    def rm_file(path, **kwargs):
        if path == f"{root}/{UPLOAD_MARKER}" and len(failed) < times:
            failed.append(path)
            raise ConnectionError("connection reset by peer")
        return real(path, **kwargs)

    monkeypatch.setattr(remote, "dst_filesystem", lambda u: (s3, u.split("://", 1)[1]))
    monkeypatch.setattr(s3, "rm_file", rm_file)


def test_a_fresh_upload_whose_marker_cannot_be_deleted_is_complete_and_says_so(s3, images, monkeypatch, caplog):
    """Bug: the marker's deletion failing after the metadata record was stored said 'publishing
    the upload failed; --resume publishes it again', and --resume then said 'already complete,
    nothing to resume', leaving the journal in the staging folder for good. The dataset is
    complete (readers take it by its metadata): the run succeeds and names the object left."""
    url = "s3://packer-test/gaps-marker"
    shutil.rmtree(staging_folder(url), ignore_errors=True)
    _marker_deletion_fails(monkeypatch, s3, "packer-test/gaps-marker", times=1)
    with caplog.at_level("WARNING", logger="packer"):
        convert(images, url, **NEW)
    monkeypatch.undo()
    said = [r.getMessage() for r in caplog.records if UPLOAD_MARKER in r.getMessage()]
    assert said == [f"{url}/{UPLOAD_MARKER}: could not delete it (connection reset by peer); the dataset is complete and "
                    "readers take it (its metadata is there): delete that object yourself"]
    assert len(read_all(url)) == 20 and not staging_folder(url).exists()
    convert(images, url, overwrite=True, **OLD)  # (the marker is packer's: replaced with the dataset)
    assert UPLOAD_MARKER not in files(s3, "packer-test/gaps-marker") and read_all(url)[0][0] == (3, 12, 12)
