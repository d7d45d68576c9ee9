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


def test_wids_opens_the_index_beside_the_shards_and_verify_checks_it(image_folder, tmp_path):
    """webdataset's indexed reader (wids) needs a shard list with sample counts for random access,
    which a packer WebDataset did not have: wids-index.json is written beside the shards, and wids
    itself reads every sample as ShardDataset does; verify says when it no longer lists the shards."""
    import io
    import json

    import numpy as np
    wids = pytest.importorskip("wids")
    from readers import ShardDataset

    out = tmp_path / "out"
    run("convert", image_folder, out / "train-%06d.tar", "--size", "8", "--shard-size", "5", "-q")
    theirs = wids.ShardListDataset(str(out / "wids-index.json"), cache_dir=str(tmp_path / "cache"), transformations=[])
    ours = ShardDataset(out)
    assert len(theirs) == len(ours) == 18 and theirs.spec["name"] == "train"
    for i in range(len(ours)):
        sample, (image, label) = theirs[i], ours[i]
        payload, cls = (sample[ext] if isinstance(sample[ext], bytes) else sample[ext].read() for ext in (".npy", ".cls"))
        assert np.array_equal(np.load(io.BytesIO(payload)), image.numpy()) and int(cls) == label
    index = out / "wids-index.json"
    record = json.loads(index.read_text())
    record["shardlist"][1]["nsamples"] += 1
    index.write_text(json.dumps(record))
    checked = CliRunner().invoke(cli, ["verify", str(out)])
    assert checked.exit_code == 1 and "wids-index.json: does not list the metadata's shards, sample counts and sizes" in checked.output
    index.unlink()
    assert "wids-index.json: missing: the metadata records it" in CliRunner().invoke(cli, ["verify", str(out)]).output
