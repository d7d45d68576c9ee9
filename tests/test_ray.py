"""Conversion on Ray (--executor ray): the same output as the local pool, skip-and-record, resume, CLI."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray executor needs: pip install 'packer[ray]'")

import lmdb  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from packer import ImageOptions, StorageOptions, convert  # noqa: E402
from packer.cli import cli  # noqa: E402
from packer.errors import OptionError  # noqa: E402
from packer.executors.ray import ray_ordered_map  # noqa: E402
from packer.info import read_metadata  # noqa: E402
from packer.parallel import WorkerError  # noqa: E402
from checkpoints import convert_until_checkpoint, inputs_converted
from faulty import crash_on_13, crash_once, hang_on_5

TIME_FIELDS = {"created"}


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray instance (2 CPUs) for the module, shut down afterwards."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")  # loopback only
    yield
    ray.shutdown()



def meta_without_time(path: Path) -> dict:
    meta = dataclasses.asdict(read_metadata(path))
    return {k: v for k, v in meta.items() if k not in TIME_FIELDS}


def lmdb_items(path: Path) -> list[tuple[bytes, bytes]]:
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=path.is_dir())
    with env.begin() as txn:
        items = list(txn.cursor())
    env.close()
    return items


def crashed(item, reason):
    return ("crashed", item, reason)


def test_a_crash_or_a_hang_on_ray_costs_only_its_item(tmp_path):
    import sys

    import faulty

    # Ray workers cannot import the test modules: send their code by value
    for module in (sys.modules[__name__], faulty):
        ray.cloudpickle.register_pickle_by_value(module)
    try:
        with ray_ordered_map(crash_on_13, list(range(30)), workers=2, chunksize=4, on_crash=crashed) as results:
            out = list(results)
        assert out[:13] == list(range(13)) and out[14:] == list(range(14, 30))
        assert out[13] == ("crashed", 13, "crashed the decoder (Ray worker died)")
        with ray_ordered_map(hang_on_5, list(range(10)), workers=2, chunksize=3, on_crash=crashed, item_timeout=1.5) as results:
            out = list(results)
        assert out[:5] == list(range(5)) and out[6:] == list(range(6, 10))
        assert out[5] == ("crashed", 5, "timed out after 1.5 s")
        with ray_ordered_map(crash_on_13, [12, 13], workers=1, chunksize=1, on_crash=crashed) as results:  # lost alone twice
            assert list(results) == [12, ("crashed", 13, "crashed the decoder (Ray worker died)")]
        marker = str(tmp_path / "died-once")  # a chunk of one whose worker died once (a WebDataset piece): run again (a walkthrough)
        with ray_ordered_map(crash_once, [marker], workers=1, chunksize=1, on_crash=crashed) as results:
            assert list(results) == [marker]
    finally:
        for module in (sys.modules[__name__], faulty):
            ray.cloudpickle.unregister_pickle_by_value(module)


def test_ray_map_keeps_input_order_in_chunks():
    # builtins: Ray workers cannot import this test module
    with ray_ordered_map(str, list(range(100)), workers=2, chunksize=7) as results:
        assert list(results) == [str(x) for x in range(100)]
    with pytest.raises(WorkerError, match="invalid literal"):
        with ray_ordered_map(int, ["1", "2", "three", "4"], workers=2, chunksize=2) as results:
            list(results)


def test_lmdb_on_ray_is_identical_to_local(tmp_path, with_bad):
    image = ImageOptions(size=16)
    local = convert(with_bad, tmp_path / "local.lmdb", image=image, workers=2)
    remote = convert(with_bad, tmp_path / "ray.lmdb", image=image, executor="ray")
    assert remote.written == local.written == 18 and remote.workers == 2
    assert [s.path for s in remote.skipped] == [s.path for s in local.skipped] == ["class_00/000_bad.jpg", "class_01/zzz_bad.jpg"]
    meta_items = lambda p: [(k, v) for k, v in lmdb_items(p) if not k.startswith(b"__")]  # noqa: E731
    assert meta_items(tmp_path / "local.lmdb") == meta_items(tmp_path / "ray.lmdb")
    assert meta_without_time(tmp_path / "local.lmdb") == meta_without_time(tmp_path / "ray.lmdb")
    assert "wrote 18 images" in remote.summary() and "skipped 2" in remote.summary()


@pytest.mark.parametrize("suffix", [".h5", ".blob"])
def test_fixed_size_single_files_on_ray_are_byte_identical_to_local(tmp_path, with_bad, fixed_clock, suffix, monkeypatch):
    """Locally the workers write a fixed-size HDF5 file's or blob's samples into it; on Ray the
    driver writes them into the same layout (packer.engine._placement): the same file. The
    summary names DST as given, as a local run's does (it said the absolute path)."""
    image = ImageOptions(size=16)
    monkeypatch.chdir(tmp_path)
    local = convert(with_bad, Path(f"local{suffix}"), image=image, workers=2)
    remote = convert(with_bad, Path(f"ray{suffix}"), image=image, executor="ray")
    assert remote.written == local.written == 18
    assert local.dst.read_bytes() == remote.dst.read_bytes()
    assert f"to ray{suffix}:" in remote.summary() and f"to local{suffix}:" in local.summary()


def test_webdataset_on_ray_is_identical_to_local(tmp_path, with_bad):
    image, storage = ImageOptions(size=16), StorageOptions(shard_size=4)
    convert(with_bad, tmp_path / "local", format="webdataset", image=image, storage=storage, workers=2)
    convert(with_bad, tmp_path / "ray", format="webdataset", image=image, storage=storage, executor="ray")
    names = sorted(p.name for p in (tmp_path / "local").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "ray").iterdir()) and len(names) > 3
    for name in names:
        if name != "packer.json":
            assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "ray" / name).read_bytes(), name
    assert meta_without_time(tmp_path / "local") == meta_without_time(tmp_path / "ray")


@pytest.mark.parametrize("ray_running", [True, False])
def test_webdataset_on_ray_fragments_few_shards_by_the_cluster_cpus(tmp_path, with_bad, monkeypatch, ray_running):
    """Without --workers, one shard for the cluster's 2 CPUs is cut into fragments, as locally,
    with the same output. Ray started for the conversion (not running before) is shut down after."""
    from packer.writers.webdataset import ShardWriter

    cut: list[int] = []
    real_pieces = ShardWriter.pieces

    def spy(self, items, image, *, workers=None, **kw):
        pieces = real_pieces(self, items, image, workers=workers, **kw)
        cut.append(len(pieces))
        return pieces

    monkeypatch.setattr(ShardWriter, "pieces", spy)
    image = ImageOptions(size=16)
    local = convert(with_bad, tmp_path / "local", format="webdataset", image=image, workers=1)
    if not ray_running:
        ray.shutdown()
        real_init = ray.init
        monkeypatch.setattr(ray, "init", lambda **kw: real_init(**kw, num_cpus=2, _node_ip_address="127.0.0.1"))  # loopback only
    try:
        remote = convert(with_bad, tmp_path / "ray", format="webdataset", image=image, executor="ray")
        assert ray.is_initialized() == ray_running  # started here: shut down again
    finally:
        if not ray_running:
            monkeypatch.undo()
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1", ignore_reinit_error=True)
    assert cut == [1, 4] and remote.workers == 2  # 1 piece for 1 worker; fragments for 2 CPUs
    assert [p.read_bytes() for p in sorted(local.dst.glob("*.tar"))] == [p.read_bytes() for p in sorted(remote.dst.glob("*.tar"))]


def test_a_ray_started_for_the_pieces_is_left_when_cutting_them_fails(tmp_path, with_bad, monkeypatch):
    """Ray joined to count the cluster's CPUs, then a failure before the map: shut down again."""
    from packer.writers.webdataset import ShardWriter

    def interrupted(self, items, image, *, workers=None, **kw):
        raise KeyboardInterrupt

    ray.shutdown()
    real_init = ray.init
    monkeypatch.setattr(ray, "init", lambda **kw: real_init(**kw, num_cpus=2, _node_ip_address="127.0.0.1"))  # loopback only
    monkeypatch.setattr(ShardWriter, "pieces", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            convert(with_bad, tmp_path / "ray", format="webdataset", image=ImageOptions(size=16), executor="ray")
        assert not ray.is_initialized()
    finally:
        monkeypatch.undo()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1", ignore_reinit_error=True)


def test_cli_executor_ray(tmp_path, image_folder):
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(tmp_path / "cli.lmdb"), "--size", "8", "--executor", "ray"])
    assert result.exit_code == 0, result.output
    assert "wrote 18 images" in result.output
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(tmp_path / "x.lmdb"), "--ray-address", "127.0.0.1:1"])
    assert result.exit_code != 0 and "--ray-address" in result.output
    with pytest.raises(OptionError, match="executor"):
        convert(image_folder, tmp_path / "y.lmdb", executor="spark")


def test_resume_on_ray_converts_only_what_is_left(tmp_path, monkeypatch):
    """A local run killed with SIGKILL after a checkpoint, resumed on Ray: finished pieces are not
    redone, and the result equals an uninterrupted run's."""
    import numpy as np

    import packer.executors.ray as ray_executor
    from imagefiles import jpeg_bytes, write
    from packer.samples import natural_image
    from packer.writers.journal import journal_path

    src = tmp_path / "src"
    data = jpeg_bytes(natural_image(np.random.default_rng(0), 375, 500), quality=90)
    for i in range(240):
        write(src / f"c{i % 2}" / f"{i:04d}.jpg", data if i != 33 else b"not a jpeg")
    dst = tmp_path / "out.shards"
    journal = journal_path(dst.with_name(dst.name + ".partial")) / "journal.json"
    args = ["convert", str(src), str(dst), "-j", "1", "-q", "--size", "24", "-f", "webdataset", "--shard-size", "20"]
    committed = convert_until_checkpoint(args, journal)
    assert 0 < committed < 240

    kwargs = dict(format="webdataset", image=ImageOptions(size=24), storage=StorageOptions(shard_size=20))
    with inputs_converted(monkeypatch, ray_executor, "ray_ordered_map") as sizes:
        report = convert(src, dst, resume=True, executor="ray", **kwargs)
    assert sizes == [240 - committed]  # only the inputs after the checkpoint were converted
    reference = convert(src, tmp_path / "ref.shards", workers=2, **kwargs)
    assert report.written == reference.written == 239
    for path in sorted(reference.dst.iterdir()):
        if path.name != "packer.json":
            assert (dst / path.name).read_bytes() == path.read_bytes(), path.name
    assert meta_without_time(dst) == meta_without_time(reference.dst)


@pytest.mark.parametrize("suffix", [".lmdb", "-shards/d-%04d.tar"])
def test_a_text_corpus_on_ray_is_the_local_conversion(tmp_path, suffix):
    """Ray tasks get documents' places (packer/sources/text_docs.py) and read the lines
    themselves, from the shared filesystem; Parquet rows and compressed files' lines go with their
    text: the same documents, skips and order as the local pool."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    from packer import TextOptions
    from readers import TokenDataset

    src = tmp_path / "corpus"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(f'{{"text": "doc {i}"}}\n' if i % 7 else "not json\n" for i in range(60)), encoding="utf-8")
    pq.write_table(pa.table({"text": [f"row {i}" if i % 5 else None for i in range(30)]}), src / "b.parquet", row_group_size=8)
    (src / "c.jsonl.gz").write_bytes(gzip.compress(b"".join(b'{"text": "packed %d"}\n' % i for i in range(40))))
    local = convert(src, tmp_path / f"local{suffix}", workers=2, text=TextOptions())
    remote = convert(src, tmp_path / f"ray{suffix}", executor="ray", text=TextOptions())
    assert remote.written == local.written == 60 - 9 + 30 - 6 + 40
    assert [(s.path, s.reason) for s in remote.skipped] == [(s.path, s.reason) for s in local.skipped]
    documents = lambda report: [TokenDataset(report.dst).decode(x) for x in TokenDataset(report.dst)]  # noqa: E731
    assert documents(remote) == documents(local)
    assert documents(local)[:2] == ["doc 1\n", "doc 2\n"] and "row 29\n" in documents(local) and documents(local)[-1] == "packed 39\n"


@pytest.mark.parametrize("address, said", [
    ("nonsense", "Invalid address format"),
    ("ray://127.0.0.1:1", "ray[client]"),
])
def test_a_ray_address_ray_refuses_is_one_line(tmp_path, address, said, monkeypatch):
    """ray.init's refusals were 60-line tracebacks, --ray-address auto (help's own example)
    without a cluster and RAY_ADDRESS included (a walkthrough). Nothing is written."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(b"")  # (never read: the cluster is joined first)
    ray.shutdown()  # (the module's instance: with Ray initialised, an address is refused before it is tried)
    try:
        result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "o.blob"), "--executor", "ray", "--ray-address", address, "-q"])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        [line] = result.stderr.strip().splitlines()
        assert line.startswith(f"Error: --ray-address {address}: Ray could not join or start a cluster there (") and said in line
        assert not list(tmp_path.glob("o.blob*"))
        monkeypatch.setenv("RAY_ADDRESS", "nonsense")
        result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "o.blob"), "--executor", "ray", "-q"])
        assert result.exit_code == 2 and result.stderr.strip() == ("Error: RAY_ADDRESS=nonsense: Ray could not join or start a "
                                                                   "cluster there (Invalid address format: nonsense)")
    finally:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")  # the module's, again


def test_a_ray_address_where_nothing_answers_is_refused_at_once(tmp_path):
    """ray.init waited on it for good, logging retries every few seconds (a typo in the port)."""
    import socket

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(b"")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # (closed again: nothing listens there)
    ray.shutdown()
    try:
        result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "o.blob"), "--executor", "ray", "--ray-address",
                                          f"127.0.0.1:{port}", "-q"])
        assert result.exit_code == 2 and result.stderr.strip() == (
            f"Error: --ray-address 127.0.0.1:{port}: nothing accepts connections at 127.0.0.1:{port} (connection refused); "
            "start the cluster there (ray start --head) or give the address `ray status` prints on its head node"), result.output
        assert not list(tmp_path.glob("o.blob*"))
    finally:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")


def test_a_cluster_asking_for_its_token_says_so(monkeypatch):
    """Ray 2.60's token authentication refused a joining process in 'InvalidAuthToken' words after
    twenty lines of retries (a Ray user's walkthrough): the line now says what it asks for."""
    from packer.errors import OptionError
    from packer.executors import ray as ray_executor

    class Refusing:
        @staticmethod
        def init(**_):
            raise ConnectionError("Failed to get cluster ID: Unauthenticated: RPC error: InvalidAuthToken: token is missing")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(OptionError, match=r"InvalidAuthToken: token is missing\); the cluster asks for its authentication token"):
        ray_executor._join(Refusing, None)

    class AuthenticationError(Exception):  # (Ray's own: no token in this process; not an OSError: a review)
        pass

    class NoToken:
        exceptions = type("exceptions", (), {"AuthenticationError": AuthenticationError})

        @staticmethod
        def init(**_):
            raise AuthenticationError("Token authentication is enabled but no authentication token was found")

    with pytest.raises(OptionError, match=r"no authentication token was found\); the cluster asks for its authentication token"):
        ray_executor._join(NoToken, None)


def test_ray_already_joined_takes_auto_and_refuses_another_address(tmp_path, image_folder):
    """A pipeline that always passes its configured address got 'already initialised' for auto,
    the cluster it had joined (a Ray user's walkthrough)."""
    from packer.errors import OptionError

    assert ray.is_initialized()
    assert convert(image_folder, tmp_path / "a.lmdb", image=ImageOptions(size=8), executor="ray", ray_address="auto").written == 18
    with pytest.raises(OptionError, match=r"^--ray-address 10\.0\.0\.9:6379: Ray is already initialised in this process \(pass no address, or auto\)$"):
        convert(image_folder, tmp_path / "b.lmdb", image=ImageOptions(size=8), executor="ray", ray_address="10.0.0.9:6379")
