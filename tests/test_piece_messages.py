"""Decoder messages from WebDataset piece workers (which convert and write whole shards) reach the
user as the local pool's do: one packer warning per input that converted, the skip reason for one
that did not, and nothing at all with ``--quiet`` (tests/test_decoder_messages.py: the pool)."""

from __future__ import annotations

from readers.formats import open_store
from test_decoder_messages import _convert_cli, odd_folder  # noqa: F401  (a fixture)


def test_a_piece_workers_decoder_messages_are_packer_warnings(odd_folder, tmp_path):  # noqa: F811
    result = _convert_cli(odd_folder, tmp_path / "out", "-f", "webdataset", "--shard-size", "4")
    assert result.returncode == 0, result.stderr
    lines = [line.split("\r")[-1].strip() for line in result.stderr.splitlines()]  # progress bar redraws: \r
    lines = [line for line in lines if line and "img/s]" not in line and "s/img]" not in line]
    assert all(line.startswith("warning: ") for line in lines), lines  # no raw decoder line
    converted = [line for line in lines if "converted, but the decoder printed: Corrupt JPEG data" in line]
    assert sorted(line.split()[1] for line in converted) == ["a/corrupt_0.jpg:", "a/corrupt_1.jpg:", "a/corrupt_2.jpg:"]
    assert sum("skipped a/damaged.tif: cannot decode" in line and "ZIPDecode" in line for line in lines) == 1
    assert sum(line.startswith("warning: skipped a/scan.jpg: truncated") for line in lines) == 1


def test_quiet_is_quiet_with_piece_workers(odd_folder, tmp_path):  # noqa: F811
    result = _convert_cli(odd_folder, tmp_path / "out", "-f", "webdataset", "--shard-size", "4", "-q")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    skipped = open_store(tmp_path / "out").meta.skipped
    assert [s.path for s in skipped] == ["a/damaged.tif", "a/scan.jpg"] and "(the decoder printed: ZIPDecode: " in skipped[0].reason
