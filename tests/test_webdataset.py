"""WebDataset shards: bounds, determinism, dense keys, the plain library, streaming, CLI, damage."""

import errno
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DataLoader

from packer import ImageOptions, StorageOptions, convert
from packer.cli import cli
from checkpoints import interrupt_at_call
from packer.errors import InputError
from packer.writers.webdataset import ShardWriter
from readers import IncompleteDatasetError, PackedFormatError, ShardDataset, StreamingShards, UnsupportedVersionError
from readers.formats import open_store
from readers.formats.tar import tar_header
from readers.formats.webdataset import CHECKSUM_FILE, INDEX_FILE, META_FILE, SOURCES_FILE, sample_key
from readers.formats.wids import WIDS_FILE


def make(src: Path, dst: Path, *, workers: int = 1, size: int = 16, **storage) -> Path:
    convert(src, dst, format="webdataset", image=ImageOptions(size=size), storage=StorageOptions(**storage), workers=workers)
    return dst


def members(path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return tar.getmembers()


def tars(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.tar"))



@pytest.fixture(scope="module")
def small_shards(image_folder, tmp_path_factory) -> Path:
    """18 samples of 16x16 in 9 shards of 2: enough shards to split over 2 ranks x 2 workers."""
    return make(image_folder, tmp_path_factory.mktemp("wds") / "small", shard_size=2)


def test_shards_bounded_by_sample_count(tmp_path, image_folder):
    dst = make(image_folder, tmp_path / "out", shard_size=5)
    meta = open_store(dst).meta
    assert meta.extra["shards"] == [f"shard-{i:06d}.tar" for i in range(4)]
    assert meta.extra["shard_counts"] == [5, 5, 5, 3]
    names = [m.name for path in tars(dst) for m in members(path)]
    assert names[:4] == ["0000000000.npy", "0000000000.cls", "0000000001.npy", "0000000001.cls"]
    assert [len(members(p)) // 2 for p in tars(dst)] == [5, 5, 5, 3]
    assert sorted(os.listdir(dst)) == sorted([INDEX_FILE, CHECKSUM_FILE, SOURCES_FILE, META_FILE, WIDS_FILE, *meta.extra["shards"]])
    assert [p.stat().st_size for p in tars(dst)] == meta.extra["shard_sizes"]


def test_shards_bounded_by_bytes_and_a_name_pattern(tmp_path, image_folder):
    per_sample = 128 + 3 * 16 * 16 + 1  # .npy header + pixels, + one label digit
    dst = tmp_path / "out" / "train-%04d.tar"
    report = convert(
        image_folder, dst, format="webdataset", image=ImageOptions(size=16), storage=StorageOptions(shard_bytes=2 * per_sample + 10), workers=1
    )
    folder = tmp_path / "out"
    assert report.dst == folder
    meta = open_store(folder).meta
    assert meta.extra["shards"][:2] == ["train-0000.tar", "train-0001.tar"] and meta.extra["shard_counts"] == [2] * 9
    for path in tars(folder):
        assert sum(m.size for m in members(path)) <= 2 * per_sample + 10
    # Both bounds: pieces of 5 inputs, each rolled into sub-shards of at most 2 samples.
    both = make(image_folder, tmp_path / "both", shard_size=5, shard_bytes=2 * per_sample)
    assert open_store(both).meta.extra["shard_counts"] == [2, 2, 1] * 3 + [2, 1]
    assert len(ShardDataset(both)) == 18


def test_output_is_byte_identical_whatever_the_worker_count(tmp_path, with_bad):
    one = make(with_bad, tmp_path / "one", workers=1, shard_size=4)
    two = make(with_bad, tmp_path / "two", workers=2, shard_size=4)
    names = [p.name for p in tars(one)]
    assert names == [p.name for p in tars(two)] and len(names) == 5
    for name in [*names, INDEX_FILE]:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name


def same_output(one: Path, two: Path) -> None:
    names = sorted(p.name for p in one.iterdir() if p.name != META_FILE)
    assert names == sorted(p.name for p in two.iterdir() if p.name != META_FILE)
    for name in names:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    assert open_store(one).meta.extra == open_store(two).meta.extra


PER_SAMPLE = 128 + 3 * 16 * 16 + 1  # .npy header + pixels, + one label digit


def test_many_workers_on_few_shards_get_a_hint(tmp_path, caplog):
    """From 8 workers and 10,000 inputs, fragments (assembled by one process) name the
    --shard-size that avoids them; not on a resume (its --shard-size is fixed), not for a few inputs."""
    writer = ShardWriter(tmp_path / "probe", StorageOptions(shard_size=1000))
    items, image = list(range(20_000)), ImageOptions(size=16)
    with caplog.at_level("WARNING", logger="packer"):
        writer.pieces(items, image, workers=4)  # type: ignore[arg-type]
        writer.pieces(items[:3000], image, workers=16)  # type: ignore[arg-type]
        assert not caplog.records
        assert len(writer.pieces(items, image, workers=16)) > 20  # type: ignore[arg-type]
        writer.resumed_inputs = 1000
        writer.pieces(items[1000:], image, workers=16)  # type: ignore[arg-type]
    writer.abort()
    assert [r.getMessage() for r in caplog.records] == [
        "20 shard(s) for 16 workers: this process assembles them from the workers' fragments, a bound of its own on the rate; "
        "--shard-size 625 lets every worker write shards of its own (docs/SCALING.md)"
    ]


@pytest.mark.parametrize(
    "storage",
    [
        dict(shard_size=100),  # one piece: fragments assembled into one shard
        dict(shard_size=20, shard_bytes=2 * PER_SAMPLE + 10),  # one piece rolled into sub-shards across fragments
        dict(shard_size=10, shard_bytes=3 * PER_SAMPLE),  # two pieces, each rolled over
    ],
)
def test_fragmented_pieces_give_byte_identical_output(tmp_path, with_bad, image_folder, storage):
    """Few pieces for the workers: they are cut into fragments that the parent assembles, with
    the same shards (keys renumbered past the skipped inputs, roll-overs where one worker puts them)."""
    writer = ShardWriter(tmp_path / "probe", StorageOptions(**storage))
    items, image = list(range(20)), ImageOptions(size=16)
    pieces = writer.pieces(items, image, workers=2)  # type: ignore[arg-type]
    assert len({p.number for p in pieces}) < len(pieces) and [i for p in pieces for i in p.items] == items
    assert [p.last for p in pieces].count(True) == len({p.number for p in pieces})
    assert writer.pieces(items, image, workers=1) == writer.pieces(items, image)  # type: ignore[arg-type]
    writer.abort()
    for n, src in enumerate((with_bad, image_folder)):
        one = make(src, tmp_path / f"one-{n}", workers=1, **storage)
        for workers in (2, 3):
            same_output(one, make(src, tmp_path / f"{workers}-{n}", workers=workers, **storage))
    keys = [m.name.split(".")[0] for path in tars(one) for m in members(path)][::2]
    assert keys == [sample_key(i) for i in range(18)] and not list(tmp_path.glob("**/.piece-*"))


@pytest.mark.skipif(not hasattr(os, "copy_file_range"), reason="copy_file_range: Linux")
@pytest.mark.parametrize("kernel", ["copies", "refuses", "forbids", "stops short"])
def test_fragments_are_copied_in_the_kernel_or_else_read_and_written(tmp_path, with_bad, kernel, monkeypatch):
    """The parent appends a worker's fragment file to its shard with ``copy_file_range`` (no
    bytes through the process); where the kernel, file system or a sandbox refuses it, or it
    copies only part, the rest is read and written: the same shards either way."""
    one = make(with_bad, tmp_path / "one", workers=1, shard_size=100)
    real, calls = os.copy_file_range, []

    def copy_file_range(src, dst, count, offset_src=None, *args):
        calls.append(count)
        if kernel in ("refuses", "forbids"):  # across file systems; a sandbox's seccomp filter
            code = errno.EXDEV if kernel == "refuses" else errno.EPERM
            raise OSError(code, os.strerror(code))
        if kernel == "stops short" and len(calls) > 1:
            return 0
        return real(src, dst, min(count, 1000) if kernel == "stops short" else count, offset_src, *args)

    monkeypatch.setattr(os, "copy_file_range", copy_file_range)
    same_output(one, make(with_bad, tmp_path / "two", workers=2, shard_size=100))
    assert calls  # the kernel was asked


def test_only_the_last_rounds_pieces_are_fragmented(tmp_path, with_bad, image_folder, monkeypatch):
    """Enough pieces for the workers: whole pieces, except those left for the last round, which
    are cut so every worker has a part of it; the output is the same as one worker's."""
    import packer.writers.webdataset.pieces as pieces_module

    monkeypatch.setattr(pieces_module, "MIN_FRAGMENT", 1)  # 20 test images: pieces of 4 may be cut
    writer = ShardWriter(tmp_path / "probe", StorageOptions(shard_size=4))
    items, image = list(range(20)), ImageOptions(size=16)  # 5 pieces of 4
    two = writer.pieces(items, image, workers=2)  # type: ignore[arg-type]
    assert [(p.number, p.fragment) for p in two] == [(0, None), (1, None), (2, None), (3, None), (4, 0), (4, 1)]
    assert [i for p in two for i in p.items] == items and two[-1].last and not two[-2].last
    assert all(p.fragment is None for p in writer.pieces(list(range(16)), image, workers=2))  # type: ignore[arg-type]  # 4 pieces: no tail
    three = writer.pieces(list(range(28)), image, workers=3)  # type: ignore[arg-type]  # 7 pieces: one left, cut in 3
    assert [p.fragment for p in three if p.number == 6] == [0, 1, 2]
    writer.abort()
    for n, src in enumerate((with_bad, image_folder)):
        one = make(src, tmp_path / f"one-{n}", workers=1, shard_size=4)
        same_output(one, make(src, tmp_path / f"two-{n}", workers=2, shard_size=4))
        same_output(make(src, tmp_path / f"one3-{n}", workers=1, shard_size=3), make(src, tmp_path / f"three-{n}", workers=3, shard_size=3))


def test_skipped_inputs_keep_keys_dense_and_are_recorded(tmp_path, with_bad, image_folder):
    dst = make(with_bad, tmp_path / "out", shard_size=4, workers=2)
    ds = ShardDataset(dst)
    assert len(ds) == 18
    assert sorted(s.path for s in ds.meta.skipped) == ["class_00/000_bad.jpg", "class_01/zzz_bad.jpg"]
    keys = [m.name.split(".")[0] for path in tars(dst) for m in members(path)][::2]
    assert keys == [sample_key(i) for i in range(18)]
    clean = ShardDataset(make(image_folder, tmp_path / "clean", shard_size=4))
    a, la = ds.read_batch(range(18))
    b, lb = clean.read_batch(range(18))
    assert torch.equal(a, b) and torch.equal(la, lb)
    with pytest.raises(InputError, match="000_bad.jpg"):
        convert(with_bad, tmp_path / "fail", format="webdataset", image=ImageOptions(size=8), workers=1, on_error="fail")
    assert not (tmp_path / "fail").exists() and not (tmp_path / "fail.partial").exists()


def test_the_webdataset_library_reads_our_shards(small_shards):
    import webdataset as wds

    ds = ShardDataset(small_shards)
    pipeline = wds.WebDataset(str(small_shards / "shard-{000000..000008}.tar"), shardshuffle=False).decode()
    samples = list(pipeline)
    assert [s["__key__"] for s in samples] == [sample_key(i) for i in range(18)]
    for i, sample in enumerate(samples):
        assert isinstance(sample["npy"], np.ndarray) and sample["npy"].shape == (3, 16, 16)
        assert np.array_equal(sample["npy"], ds[i][0].numpy()) and sample["cls"] == ds[i][1]


def fingerprints(ds: ShardDataset) -> dict[bytes, int]:
    table = {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}
    assert len(table) == len(ds), "test images must differ"
    return table


def test_streaming_reads_every_sample_over_ranks_and_workers_padding_the_shorter_rank(small_shards):
    """9 shards of 2 over 2 ranks: 10 and 8 samples; the second rank repeats 2 of its own."""
    table = fingerprints(ShardDataset(small_shards))
    for epoch in range(2):
        parts = []
        for rank in range(2):
            stream = StreamingShards(small_shards, shuffle=True, buffer=4, seed=7, rank=rank, world_size=2)
            stream.set_epoch(epoch)
            loader = DataLoader(stream, batch_size=None, num_workers=2)
            got = [table[x.numpy().tobytes()] for x, _ in loader]
            assert len(got) == len(stream) == 10
            parts.append(got)
        assert set(parts[0]) | set(parts[1]) == set(range(18)) and not set(parts[0]) & set(parts[1])
        assert len(set(parts[0])) == 10 and len(set(parts[1])) == 8  # the padding repeats the rank's own samples


def test_streaming_order_is_reproducible_per_seed_and_epoch(small_shards):
    table = fingerprints(ShardDataset(small_shards))

    def order(seed: int, epoch: int, shuffle: bool = True) -> list[int]:
        stream = StreamingShards(small_shards, shuffle=shuffle, buffer=6, seed=seed)
        stream.set_epoch(epoch)
        return [table[x.numpy().tobytes()] for x, _ in stream]

    assert order(0, 0, shuffle=False) == list(range(18))
    assert order(1, 0) == order(1, 0) and sorted(order(1, 0)) == list(range(18))
    assert order(1, 0) != order(1, 1) and order(1, 0) != order(2, 0)
    labels = [y for _, y in StreamingShards(small_shards)]
    assert labels == [y for _, y in ShardDataset(small_shards)]


def test_brace_patterns_and_pipe_urls(small_shards):
    ds = ShardDataset(small_shards)
    braces = StreamingShards(str(small_shards / "shard-{000002..000003}.tar"))
    assert len(braces) == 4
    got = list(braces)
    assert all(torch.equal(x, ds[4 + j][0]) and y == ds[4 + j][1] for j, (x, y) in enumerate(got)) and len(got) == 4
    piped = StreamingShards([f"pipe:cat {small_shards / 'shard-000001.tar'}"])
    got = list(piped)
    assert len(got) == 2 and torch.equal(got[1][0], ds[3][0])
    with pytest.raises(TypeError, match="unknown"):
        len(piped)


def test_cli_convert_and_info(tmp_path, image_folder):
    dst = tmp_path / "out_dir"
    result = CliRunner().invoke(cli, ["convert", str(image_folder), str(dst), "--format", "webdataset", "--shard-size", "5", "--size", "12", "-q"])
    assert result.exit_code == 0, result.output
    assert "wrote 18 images in 3 classes (3x12x12, raw)" in result.stdout
    assert len(tars(dst)) == 4
    info = CliRunner().invoke(cli, ["info", str(dst)])
    assert info.exit_code == 0 and "webdataset" in info.stdout and "samples    18" in info.stdout
    bad = CliRunner().invoke(cli, ["convert", str(image_folder), "train-%d.tar", "--format", "webdataset"])
    assert bad.exit_code == 2 and "folder of its own" in bad.stderr


def test_interrupted_conversion_leaves_no_output(tmp_path, image_folder, monkeypatch):
    keep = make(image_folder, tmp_path / "keep", shard_size=5)
    before = {p.name: p.read_bytes() for p in keep.iterdir()}
    calls = interrupt_at_call(monkeypatch, ShardWriter, "add_piece", 2)
    with pytest.raises(KeyboardInterrupt):
        make(image_folder, tmp_path / "new", shard_size=5, workers=2)
    calls["n"] = 0
    with pytest.raises(KeyboardInterrupt):
        convert(image_folder, keep, format="webdataset", image=ImageOptions(size=8), storage=StorageOptions(shard_size=5), workers=1, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["keep"]
    assert {p.name: p.read_bytes() for p in keep.iterdir()} == before


def damaged(src: Path, dst: Path, change) -> Path:
    shutil.copytree(src, dst)
    change(dst)
    return dst


def test_missing_metadata_means_incomplete(tmp_path, small_shards):
    path = damaged(small_shards, tmp_path / "nometa", lambda p: (p / META_FILE).unlink())
    with pytest.raises(IncompleteDatasetError, match="did not finish"):
        ShardDataset(path)
    with pytest.raises(IncompleteDatasetError):
        open_store(path)


def test_newer_format_version_is_refused(tmp_path, small_shards):
    def bump(p: Path) -> None:
        meta = json.loads((p / META_FILE).read_text())
        meta["format_version"] += 1
        (p / META_FILE).write_text(json.dumps(meta))

    path = damaged(small_shards, tmp_path / "new", bump)
    with pytest.raises(UnsupportedVersionError, match="update packer"):
        ShardDataset(path)
    with pytest.raises(UnsupportedVersionError):
        StreamingShards(path)


def test_truncated_shard_is_a_clear_error(tmp_path, small_shards):
    def cut(p: Path) -> None:
        with open(p / "shard-000003.tar", "r+b") as handle:
            handle.truncate(1500)

    path = damaged(small_shards, tmp_path / "cut", cut)
    with pytest.raises(PackedFormatError, match=r"shard-000003.tar: shard has 1,500 bytes.*truncated"):
        ShardDataset(path)
    with pytest.raises(PackedFormatError, match=r"shard-000003.tar: the shard is truncated"):
        list(StreamingShards(path))


def test_the_index_is_a_plain_int64_array_locating_every_member(tmp_path, with_bad):
    """packer-index.npy, read by numpy alone, is (count, 7) int64 with the columns docs/FORMATS.md
    lists (shard, offset, nbytes, label, C, H, W), each row where tarfile finds the sample."""
    dst = make(with_bad, tmp_path / "out", shard_size=5, workers=2)  # skipped inputs: renumbered shards
    index = np.load(dst / INDEX_FILE, allow_pickle=False)
    meta = json.loads((dst / META_FILE).read_text())
    assert index.dtype == np.dtype("<i8") and index.shape == (meta["count"], 7) and meta["extra"]["index_columns"] == [
        "shard", "offset", "nbytes", "label", "channels", "height", "width"]
    i = 0
    for number, name in enumerate(meta["extra"]["shards"]):
        with tarfile.open(dst / name) as tar:
            found = tar.getmembers()
            for image, label in zip(found[0::2], found[1::2]):
                shard, offset, nbytes, stored_label, c, h, w = index[i].tolist()
                pixels = np.load(io.BytesIO(tar.extractfile(image).read()), allow_pickle=False)
                assert image.name == f"{sample_key(i)}.npy" and (shard, pixels.shape) == (number, (c, h, w))
                assert (offset, nbytes) == (image.offset_data + image.size - pixels.nbytes, pixels.nbytes)
                assert int(tar.extractfile(label).read()) == stored_label
                i += 1
    assert i == meta["count"]


def test_the_pieces_protocol_is_declared():
    """ShardWriter is a PieceWriter (what the driver checks); a piece writer that leaves out a
    method of the protocol cannot be made."""
    from packer.writers.piece_writer import PieceWriter

    assert issubclass(ShardWriter, PieceWriter)

    class Incomplete(PieceWriter):
        def pieces(self, items, image, *, workers=None):
            return []

        def piece_task(self, image, task=None, *, in_memory=False):
            return print

    with pytest.raises(TypeError, match="add_piece"):
        Incomplete("unused")


@pytest.mark.parametrize("name", ["0000000007.npy", "0000000007.cls", "a", "x" * 99 + ".", "x" * 100, "d/" * 60 + "long.npy"])
@pytest.mark.parametrize("size", [0, 1, 511, 512, 150_656, 8**11 - 1, 8**11])
def test_tar_headers_are_the_ones_the_tarfile_module_writes(name, size):
    """Built directly for short names (a WebDataset worker writes two per sample); byte for byte
    the standard library's ustar header, and read back by it as the same member."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uname, info.gname = size, 0o644, 0, "", ""
    if size >= 8**11:  # beyond ustar's size field: refused alike
        with pytest.raises(ValueError):
            info.tobuf(tarfile.USTAR_FORMAT, "ascii", "strict")
        with pytest.raises(ValueError):
            tar_header(name, size)
        return
    header = tar_header(name, size)
    assert header == info.tobuf(tarfile.USTAR_FORMAT, "ascii", "strict")
    read = tarfile.TarInfo.frombuf(header, "ascii", "strict")
    assert (read.name, read.size, read.mode, read.mtime, read.type) == (name, size, 0o644, 0, tarfile.REGTYPE)


def test_the_summary_names_the_workers_that_had_a_piece(image_folder, tmp_path, monkeypatch):
    """Workers get whole pieces: with one piece, one worker runs, whatever --workers says (the
    summary said "with 2 workers", capped by the inputs, not by the pieces)."""
    real_pieces = ShardWriter.pieces
    monkeypatch.setattr(ShardWriter, "pieces", lambda self, items, image, workers=None, **kw: real_pieces(self, items, image, **kw))  # no fragments
    report = convert(image_folder, tmp_path / "one", format="webdataset", image=ImageOptions(size=8), workers=2)
    assert report.written == 18 and report.workers == 1 and "with 1 worker" in report.summary()
