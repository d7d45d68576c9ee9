"""Gaps a mutation sweep of the remote-destination code (URL.partial, the upload marker, the
Uploader's publish/stop/discard) found in tests/test_remote_replace.py and its neighbours (moto's
S3 on 127.0.0.1, and file://). Each test names the mutant or the bug it was seen failing under."""

from __future__ import annotations

import os
import shutil
import threading
import time

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


def _uploader_with_one_file(tmp_path, **kwargs):
    from packer.remote import Uploader

    uploader = Uploader(f"file://{tmp_path / 'out'}", marker=(UPLOAD_MARKER, b"{}\n"), **kwargs)
    (tmp_path / "shard-000000.tar").write_bytes(b"shard")
    return uploader


def test_a_stop_fails_a_flush_waiting_in_another_thread(tmp_path):
    """Mutant (Uploader.flush waiting without 'not self._stopped'): a flush in another thread (a
    checkpoint's) waited for the upload in progress, here held back 30 s, though stop() had come."""
    release = threading.Event()
    uploader = _uploader_with_one_file(tmp_path)
    real = uploader.fs

    class Held:
        def __getattr__(self, name):
            return getattr(real, name)

        def put_file(self, *args, **kwargs):
            release.wait(30)
            return real.put_file(*args, **kwargs)

    uploader.fs = Held()
    uploader.put(tmp_path / "shard-000000.tar")
    raised = []

    def flush():
        try:
            uploader.flush()
        except OutputError as exc:
            raised.append(str(exc))

    waiting = threading.Thread(target=flush)
    waiting.start()
    time.sleep(0.2)
    uploader.stop()
    waiting.join(5)
    release.set()
    assert not waiting.is_alive() and raised == [f"file://{tmp_path / 'out'}: the uploader is closed"]


def test_a_discard_after_publishing_began_keeps_what_is_stored(tmp_path):
    """Mutant (Uploader.discard without its 'if self.publishing' return): a publish that failed
    was followed by the removal of the whole upload, which --resume was told to publish again."""
    def fail(fs, root):
        raise ConnectionError("connection reset by peer")

    uploader = _uploader_with_one_file(tmp_path, publish=fail)
    uploader.put(tmp_path / "shard-000000.tar")
    with pytest.raises(OutputError, match="publishing the upload failed .*--resume publishes it again"):
        uploader.publish()
    uploader.discard()
    assert sorted(os.listdir(tmp_path / "out")) == [UPLOAD_MARKER, "shard-000000.tar"]


@pytest.mark.parametrize("exc, expected", [(PermissionError("access denied"), OutputError), (KeyboardInterrupt(), KeyboardInterrupt)])
def test_storing_the_marker_fails_in_one_line_and_an_interrupt_stays_one(tmp_path, monkeypatch, exc, expected):
    """Mutant (Uploader._store_marker turning every exception into OutputError): a Ctrl-C as the
    marker was stored said 'cannot store there (...)'. The store's own error is one line; either
    way no upload thread is left running."""
    import fsspec.implementations.local as local
    from packer.remote import Uploader

    def fail(self, path, value, **kwargs):
        raise exc

    monkeypatch.setattr(local.LocalFileSystem, "pipe_file", fail)
    before = threading.active_count()
    with pytest.raises(expected) as raised:
        Uploader(f"file://{tmp_path / 'out'}", marker=(UPLOAD_MARKER, b"{}\n"))
    if expected is OutputError:
        assert str(raised.value) == f"file://{tmp_path / 'out'}: cannot store there (access denied)"
    assert threading.active_count() == before


def test_an_overwrite_removes_an_interrupted_overwrites_partial_even_where_url_is_gone(s3, images):
    """Mutant (_store_url not removing URL.partial on --overwrite): the new run's writer empties
    it when it stores there, but where the old dataset at URL is gone (or unfinished) the new one
    goes to URL, and an interrupted --overwrite's URL.partial (its marker and a shard) was left."""
    url = "s3://packer-test/gaps-gone"
    shutil.rmtree(staging_folder(url), ignore_errors=True)
    s3.pipe({f"packer-test/gaps-gone.partial/{UPLOAD_MARKER}": b"{}\n", "packer-test/gaps-gone.partial/shard-000000.tar": bytes(1024)})
    with pytest.raises(OutputError, match=r"gaps-gone.partial; --resume carries it on, --overwrite starts over"):
        convert(images, url, **NEW)
    convert(images, url, overwrite=True, **NEW)
    s3.invalidate_cache()
    assert not s3.exists("packer-test/gaps-gone.partial") and len(read_all(url)) == 20


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


def test_a_replace_cut_short_as_its_marker_goes_is_done_again_by_resume(s3, images, monkeypatch):
    """Mutant (replace_with deleting URL.partial before the marker at URL): the marker's deletion
    failing then left no URL.partial for --resume, which said 'already complete, nothing to
    resume', and the marker stayed in the finished dataset for good."""
    url = "s3://packer-test/gaps-cut"
    shutil.rmtree(staging_folder(url), ignore_errors=True)
    convert(images, url, **OLD)
    _marker_deletion_fails(monkeypatch, s3, "packer-test/gaps-cut", times=1)
    with pytest.raises(OutputError, match=r"publishing the upload failed .*--resume publishes it again"):
        convert(images, url, overwrite=True, **NEW)
    monkeypatch.undo()
    convert(images, url, resume=True, **NEW)
    s3.invalidate_cache()
    assert UPLOAD_MARKER not in files(s3, "packer-test/gaps-cut") and not s3.exists("packer-test/gaps-cut.partial")
    assert read_all(url)[0][0] == (3, 8, 8) and len(read_all(url)) == 20 and not staging_folder(url).exists()


@pytest.mark.parametrize("finished_old", [False, True])
def test_a_resume_without_a_journal_leaves_none_of_the_earlier_runs_shards(s3, images, tmp_path, finished_old):
    """Mutant (ShardWriter._open not removing what the sink holds): a --resume on another machine
    (no journal here: it starts over) of an upload interrupted there, whose shards outnumber
    this run's, left the extra ones beside the new metadata (and --overwrite then refused them as
    files packer did not write); at URL.partial they were copied over the old dataset with the rest."""
    from test_remote import assert_same_output

    url, root = f"s3://packer-test/gaps-elsewhere-{finished_old}", f"packer-test/gaps-elsewhere-{finished_old}"
    shutil.rmtree(staging_folder(url), ignore_errors=True)
    if finished_old:
        convert(images, url, **OLD)
    staged = root + (".partial" if finished_old else "")
    s3.pipe({f"{staged}/{UPLOAD_MARKER}": b"{}\n", **{f"{staged}/shard-{i:06d}.tar": bytes(1024) for i in range(5)}})
    convert(images, url, resume=True, **NEW)
    assert_same_output(s3, root, convert(images, tmp_path / "local", **NEW).dst)
    s3.invalidate_cache()
    assert not s3.exists(root + ".partial")


def test_an_upload_in_progress_is_refused_given_as_a_list_of_its_urls(s3, images, monkeypatch):
    """Mutant (resolve_shards checking the marker only for a brace pattern, not a list of URLs):
    StreamingShards took a list of an unfinished upload's shards as foreign shards."""
    url = "s3://packer-test/gaps-listed"
    shutil.rmtree(staging_folder(url), ignore_errors=True)
    seen = []

    def check(writer):
        with pytest.raises(IncompleteDatasetError, match=f"^{url}: an unfinished upload by packer .it holds {UPLOAD_MARKER}"):
            StreamingShards([f"{url}/shard-000000.tar", f"{url}/shard-000001.tar"])
        seen.append(True)

    failing_after(monkeypatch, 2, check)
    with pytest.raises(RuntimeError, match="disk on fire"):
        convert(images, url, **NEW)
    assert seen == [True]


def test_the_marker_is_the_documented_object(s3, images, monkeypatch):
    """Mutants (UPLOAD_MARKER renamed; marker_bytes without the pid): docs/FORMATS.md names the
    object packer-uploading.json and its JSON fields, which other packer versions and a user
    looking at the folder go by; every other test used the constant."""
    import json
    import socket

    url = "s3://packer-test/gaps-marked"
    shutil.rmtree(staging_folder(url), ignore_errors=True)
    seen = []
    failing_after(monkeypatch, 1, lambda writer: seen.append(json.loads(s3.cat("packer-test/gaps-marked/packer-uploading.json"))))
    with pytest.raises(RuntimeError, match="disk on fire"):
        convert(images, url, **NEW)
    (record,) = seen
    assert sorted(record) == ["host", "packer_upload", "pid", "started"]
    assert record["packer_upload"] == "in progress" and record["host"] == socket.gethostname() and record["pid"] == os.getpid()
    assert record["started"].endswith("+00:00")


def test_an_upload_another_machine_is_storing_is_left_to_it(s3, images):
    """Machine B's --overwrite or journal-less --resume deleted machine A's upload in progress at
    the URL, or at URL.partial (a helper session's design read): this machine's lock cannot see
    A's conversion. The marker names its host: another host's upload is refused, whatever the
    flags, naming it and how to take it over; nothing of it is touched."""
    import json

    for place in ("s3://packer-test/gaps-elsewhere", "s3://packer-test/gaps-elsewhere-b"):
        url = place
        if place.endswith("-b"):  # an --overwrite from the other machine storing the new dataset beside
            convert(images, url, **OLD)
            root = "packer-test/gaps-elsewhere-b.partial"
        else:
            root = "packer-test/gaps-elsewhere"
        shutil.rmtree(staging_folder(url), ignore_errors=True)
        marker = {"packer_upload": "in progress", "host": "node-7-elsewhere", "pid": 4242, "started": "2026-11-28T13:05:00+00:00"}
        s3.pipe({f"{root}/{UPLOAD_MARKER}": json.dumps(marker).encode(), f"{root}/shard-000000.tar": b"\0" * 1024})
        before = files(s3, root)
        for flags in ({}, {"overwrite": True}, {"resume": True}):
            with pytest.raises(OutputError, match=rf"^{url}: s3://{root} holds an upload from another machine \(node-7-elsewhere, pid "
                                                  rf"4242, started 2026-11-28T13:05:00\+00:00\), running there or interrupted there: "
                                                  rf"finish it there \(packer convert --resume\), or remove "
                                                  rf"{root.rsplit('/', 1)[-1]}/{UPLOAD_MARKER} to take it over from here$"):
                convert(images, url, **NEW, **flags)
            assert files(s3, root) == before
        s3.rm_file(f"{root}/{UPLOAD_MARKER}")  # taken over: this machine's --overwrite replaces it
        s3.pipe({f"{root}/{UPLOAD_MARKER}": json.dumps({**marker, "host": __import__("socket").gethostname()}).encode()})
        convert(images, url, overwrite=True, **NEW)
        assert len(read_all(url)) == 20


def _staged_removal_cut(monkeypatch, s3, staged: str, removed, exc: BaseException) -> None:
    """Each removal the store is asked for that touches ``staged`` deletes ``removed(objects asked for)``,
    then raises ``exc`` (the connection drops, a Ctrl-C lands); every other call passes."""
    import packer.remote as remote

    real_rm = s3.rm

    def rm_then_cut(path, *args, **kwargs):
        paths = [path] if isinstance(path, str) else list(path)
        if any(p.rstrip("/").startswith(staged) for p in paths):
            s3.invalidate_cache()
            real_rm(removed(sorted(o for p in paths for o in (s3.find(p) if p.rstrip("/") == staged else [p]))))
            raise exc
        return real_rm(path, *args, **kwargs)

    monkeypatch.setattr(remote, "dst_filesystem", lambda u: (s3, u.split("://", 1)[1]))
    monkeypatch.setattr(s3, "rm", rm_then_cut)


def test_a_clean_up_cut_short_after_publishing_keeps_the_new_dataset(s3, images, monkeypatch, caplog):
    """Bug: URL.partial was removed as part of publishing, in one call and any order; cut short
    once it had lost shards, the run failed with its dataset at URL complete, and --resume was
    refused (a shard changed since the checkpoint), its journal never to finish. (d1f6790 said
    --resume published again and removed the new shards; the sweep of it did not reproduce that.)
    It is removed once the journal is gone now (a failure is said: the dataset is complete), its
    marker last, so a later --overwrite knows it for packer's and removes it."""
    url, staged = "s3://packer-test/gaps-clean", "packer-test/gaps-clean.partial"
    shutil.rmtree(staging_folder(url), ignore_errors=True)
    convert(images, url, **OLD)
    _staged_removal_cut(monkeypatch, s3, staged, lambda objects: objects[:-1], ConnectionError("connection reset by peer"))
    convert(images, url, overwrite=True, **NEW)
    monkeypatch.undo()
    said = [r.getMessage() for r in caplog.records if "staged copy could not be removed" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("s3://packer-test/gaps-clean.partial: the dataset is complete")
    assert UPLOAD_MARKER in files(s3, staged) and not staging_folder(url).exists()  # no journal: nothing publishes again
    assert read_all(url)[0][0] == (3, 8, 8) and len(read_all(url)) == 20
    convert(images, url, overwrite=True, **OLD)  # removes the leftover, known for packer's by its marker
    s3.invalidate_cache()
    assert not s3.exists(staged) and read_all(url)[0][0] == (3, 12, 12) and len(read_all(url)) == 20


def test_an_overwrite_killed_while_removing_its_staged_copy_is_not_published_again(s3, images, monkeypatch):
    """A Ctrl-C (or a kill) once URL.partial had lost shards but not its metadata record: the
    journal is gone by then (the removal runs after it), so nothing is left for a --resume to
    publish again, and the dataset stays whole. (The removal run inside publishing, before the
    journal went, fails the first assertion; the resume after it was then refused on a shard
    changed since the checkpoint here, not published.)"""
    url, staged = "s3://packer-test/gaps-killed", "packer-test/gaps-killed.partial"
    shutil.rmtree(staging_folder(url), ignore_errors=True)
    convert(images, url, **OLD)
    _staged_removal_cut(monkeypatch, s3, staged, lambda objects: [o for o in objects if o.endswith(".tar")][:2], KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        convert(images, url, overwrite=True, **NEW)
    monkeypatch.undo()
    s3.invalidate_cache()
    assert s3.exists(staged) and not staging_folder(url).exists()
    try:
        convert(images, url, resume=True, **NEW)
    except (OutputError, ValueError):
        pass  # (refused: the dataset is complete)
    s3.invalidate_cache()
    assert [shape for shape, _ in read_all(url)] == [(3, 8, 8)] * 20


def test_a_staged_copy_that_cannot_be_listed_at_clean_up_is_said_and_the_run_succeeds(s3, images, monkeypatch, caplog):
    """Listing URL.partial for its removal fails (the connection drops once the dataset is
    published and the journal gone): the run still succeeds, the leftover is said, as a
    removal that fails is; it failed the conversion of a complete dataset."""
    import packer.remote as remote

    url, staged = "s3://packer-test/gaps-unlisted", "packer-test/gaps-unlisted.partial"
    shutil.rmtree(staging_folder(url), ignore_errors=True)
    convert(images, url, **OLD)
    real_ls, real_clean_up, cleaning = s3.ls, remote.Uploader.clean_up, []

    def ls_failing_once_published(path, *args, **kwargs):
        if path.rstrip("/") == staged and cleaning:
            raise ConnectionError("connection reset by peer")
        return real_ls(path, *args, **kwargs)

    monkeypatch.setattr(remote, "dst_filesystem", lambda u: (s3, u.split("://", 1)[1]))
    monkeypatch.setattr(remote.Uploader, "clean_up", lambda self: (cleaning.append(1), real_clean_up(self))[1])
    monkeypatch.setattr(s3, "ls", ls_failing_once_published)
    convert(images, url, overwrite=True, **NEW)
    monkeypatch.undo()
    said = [r.getMessage() for r in caplog.records if "staged copy could not be removed" in r.getMessage()]
    assert len(said) == 1 and "connection reset by peer" in said[0]
    s3.invalidate_cache()
    assert [shape for shape, _ in read_all(url)] == [(3, 8, 8)] * 20
