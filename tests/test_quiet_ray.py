"""``--quiet`` with ``--executor ray``: nothing on stderr, not even Ray's own start-up lines
("Started a local Ray instance", its token-authentication notice), as with the local pool."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the Ray executor needs: pip install 'packer[ray]'")

REPO = Path(__file__).resolve().parents[1]


def test_quiet_means_quiet_on_ray(image_folder, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "packer", "convert", str(image_folder), str(tmp_path / "r.lmdb"), "--size", "8", "--executor", "ray", "-q"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    assert result.stdout.startswith("wrote 18 images")
