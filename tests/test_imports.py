"""Training jobs import ``readers`` alone: it must not pull in the conversion side."""

import json
import subprocess
import sys

CONVERSION_ONLY = ["click", "cv2", "packer"]  # (torch itself imports tqdm when installed)


def loaded_after(code: str) -> set[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_readers_import_nothing_from_the_conversion_side():
    modules = loaded_after("import readers\nfrom readers import LMDBDataset, Normalize\nLMDBDataset, Normalize")
    assert "readers.lmdb" in modules and "torch" in modules
    assert not [m for m in CONVERSION_ONLY if m in modules]


def test_importing_readers_is_lazy():
    modules = loaded_after("import readers")
    assert "torch" not in modules and "lmdb" not in modules


def test_the_cli_does_not_import_torch():
    modules = loaded_after("from packer.cli import cli\nimport packer.info")
    assert "torch" not in modules
