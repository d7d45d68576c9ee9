"""The fault campaign (benchmarks/faults.py) in miniature, and where benchmarks write.

The full campaign (``python -m benchmarks.faults --trials 20``) takes a quarter of an hour; here
one trial of each kind of fault on one format checks that the script's parts run end to end and
that its comparison notices a damaged dataset (so "data lost: 0" is a measured figure).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is a package of the repository, not installed
from benchmarks import common, faults, run  # noqa: E402
from packer import ImageOptions, convert  # noqa: E402
from readers.formats import open_store  # noqa: E402

pytestmark = pytest.mark.slow  # a few subprocess conversions: some seconds


def test_one_trial_of_each_fault_loses_nothing(tmp_path):
    results = faults.run_campaign(faults.Campaign(trials=1, formats=("blob",), images=40, workdir=tmp_path), say=lambda _: None)
    kinds = [t["kind"] for t in results["trials"]]
    expected = [k for k in faults.KINDS if k not in results["skipped"]]
    assert kinds == expected and set(results["skipped"]) <= {"enospc"}  # ENOSPC needs root to mount a tmpfs
    lost = [t for t in results["trials"] if t["data_lost"]]
    assert not lost, lost
    tops = [row for row in results["summary"] if row["level"] == 0]
    assert [row["kind"] for row in tops] == expected and all(row["trials"] == {"blob": 1} for row in tops)
    table = faults.render(results)
    assert f"{len(expected)} trials, data lost: 0" in table
    byteflip = next(t for t in results["trials"] if t["kind"] == "byteflip")
    assert byteflip["outcome"] == "reported at the right sample"
    assert list(tmp_path.iterdir()) == []  # every throwaway conversion removed


def test_the_comparison_notices_a_changed_sample(tmp_path, image_folder):
    reference = convert(image_folder, tmp_path / "ref.blob", image=ImageOptions(size=8), workers=1).dst
    damaged = Path(shutil.copy(reference, tmp_path / "damaged.blob"))
    expected = faults.digest(reference)
    assert expected.difference(faults.digest(damaged)) is None
    payload = open_store(reference).read(5)[0].tobytes()
    path, offset = faults.locate_payload([damaged], payload)  # where sample 5 is stored: one place
    data = bytearray(path.read_bytes())
    data[offset + 7] ^= 0x40
    path.write_bytes(bytes(data))
    assert expected.difference(faults.digest(damaged)).startswith("sample 5:")


def test_benchmarks_keep_the_page_cache_and_the_committed_results_unless_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "OUT_DIR", tmp_path / "out")
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path / "results")
    assert common.output_dir() == tmp_path / "out"
    assert common.output_dir(update_results=True) == tmp_path / "results"
    assert common.output_dir(out=tmp_path / "x") == tmp_path / "x"

    calls: dict[str, object] = {}

    def fake_suite(src, mode, *, peers=True, cold=False):
        calls["cold"] = cold
        return {"read": [], "convert": [], "cold": [], "notes": []}

    monkeypatch.setattr(run, "run_suite", fake_suite)
    monkeypatch.setattr(run, "drop_page_cache", lambda: calls.setdefault("dropped", True))
    monkeypatch.setattr(run, "imagenet_like", lambda images: tmp_path)
    monkeypatch.setattr(run, "machine", lambda: {})
    monkeypatch.setattr(run, "versions", lambda: {})
    monkeypatch.setattr(run, "render", lambda results: "")
    monkeypatch.setattr(run, "chart", lambda results, path: calls.setdefault("chart", path))
    run.main(["--quick"])
    assert calls["cold"] is False and "dropped" not in calls
    assert (tmp_path / "out" / "quick.json").is_file() and calls["chart"] == tmp_path / "out" / "quick-throughput.png"
    assert not (tmp_path / "results").exists()
    run.main(["--quick", "--update-results", "--drop-caches"])
    assert calls["cold"] is True and (tmp_path / "results" / "quick.json").is_file()
