"""benchmarks.one_writer runs CI-sized on any machine: every row, (a) the writers alone to (e)
the plain way, each with a positive median, saved under its tag (issue 16's one-writer figures,
which a many-core host reruns with benchmarks/many_cores.sh)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is a package of the repository, not installed
from benchmarks import one_writer  # noqa: E402


def test_every_row_runs_and_is_saved_under_its_tag(tmp_path):
    one_writer.main(["--samples", "40", "--repeats", "1", "--tag", "ci", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "one_writer-ci.json").read_text())
    rates = result["rates"]
    for fmt in ("lmdb", "hdf5", "blob"):
        assert f"(a) {fmt} writer alone" in rates
        assert any(name.startswith(f"(c) {fmt}: pool + writer") for name in rates)
    assert any(name.startswith("(d) blob") for name in rates) and any(name.startswith("(d) hdf5") for name in rates)
    assert any(name.startswith("(b) pool alone") for name in rates) and any(name.startswith("(e)") for name in rates)
    assert all(r["median"] > 0 for r in rates.values()), rates
    assert result["samples"] == 40 and result["sample_bytes"] == 3 * 224 * 224
