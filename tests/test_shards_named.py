"""A WebDataset's shards as webdataset reads them: ``packer info`` has a ``shards`` row (the count
and the brace pattern) and the line after a conversion names the pattern, where neither said how
many shards there were nor how to name them to webdataset (last session's webdataset walkthrough).
Checked by webdataset itself: the pattern expands to every shard, in order."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from packer.cli import cli


def run(*args) -> str:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("name, braces", [("train-%06d.tar", "train-{000000..000008}.tar"), ("s%d.tar", "s{0..8}.tar")])
def test_info_and_the_conversion_name_the_shards_as_webdataset_reads_them(image_folder, tmp_path, monkeypatch, name, braces):
    import webdataset as wds

    monkeypatch.chdir(tmp_path)
    said = run("convert", image_folder, f"out/{name}", "--size", "8", "--shard-size", "2")
    assert f"or webdataset's 'out/{braces}' (9 shards)" in said
    row = re.search(r"^  shards\s+(.*)$", run("info", "out"), re.M).group(1)
    assert row == f"9: out/{braces}"
    keys = [sample["__key__"] for sample in wds.WebDataset(f"out/{braces}", shardshuffle=False)]
    assert len(keys) == 18 and keys == sorted(keys)


def test_one_shard_is_its_path_and_a_text_dataset_has_the_row_too(image_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "; stream it: readers.StreamingShards('one'), or webdataset's 'one/shard-000000.tar' (1 shard); see it" in run("convert", image_folder, "one", "--format", "webdataset", "--size", "8")
    (tmp_path / "docs").mkdir()
    for i in range(3):
        (tmp_path / "docs" / f"{i}.txt").write_text(f"document {i} " * 5)
    run("convert", "docs", "tokens/t-%04d.tar", "--shard-size", "2")
    assert re.search(r"^  shards\s+2: tokens/t-\{0000\.\.0001\}\.tar$", run("info", "tokens"), re.M)


@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_shard_bytes_caps_every_shard_and_raw_samples_fill_them(image_folder, tmp_path, encoding):
    """README: ``--shard-bytes`` is a cap on each shard's member bytes (tar headers aside); raw
    samples fill every shard but the last; jpeg/png pieces are cut from an estimate (smaller shards
    at their ends). Read with tarfile."""
    import json
    import tarfile

    cap = 1300
    run("convert", image_folder, tmp_path / "out", "--format", "webdataset", "--size", "8", "--encoding", encoding,
        "--shard-bytes", cap, "--workers", "2", "-q")
    meta = json.loads((tmp_path / "out" / "packer.json").read_text())
    sizes = []
    for name in meta["extra"]["shards"]:
        with tarfile.open(tmp_path / "out" / name) as tar:
            sizes.append(sum(member.size for member in tar.getmembers()))
    counts = meta["extra"]["shard_counts"]
    assert sum(counts) == 18 and max(sizes) <= cap and len(counts) > 1
    if encoding == "raw":
        assert len(set(counts[:-1])) == 1 and counts[-1] <= counts[0], counts
