"""Gaps a mutation sweep of the remote-destination code (URL.partial, the upload marker, the
Uploader's publish/stop/discard) found in tests/test_remote_replace.py and its neighbours (moto's
S3 on 127.0.0.1, and file://). Each test names the mutant or the bug it was seen failing under."""

from __future__ import annotations

import shutil

import pytest

from packer import convert
from packer.errors import OutputError
from packer.remote import staging_folder
from test_remote_replace import NEW, OLD, files, read_all


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
