"""Every README code block runs as written, on a CPU machine, on small generated inputs.

Convention: every fenced ```python, ```bash and ```console block runs, in document order, unless
the line before its fence is ``<!-- norun: reason -->`` (environment set-up, benchmarks). A shell
block is a session of ``packer ...`` commands (run in-process through click, ``#`` comments
allowed): it starts in a fresh folder holding the sample inputs the README names (imagenet/train,
corpus/, images/ with its CSVs, the ILSVRC-style tars, old-shards/, imagenet-1k/data/). A Python block runs in the
folder of the block before it, so it can read what that block wrote. Blocks of other languages
(``text``, plain fences) are output or layout, never run.

Also: ``examples/quickstart.py``, which the quick start tells users to run, runs here (tiny).
"""

from __future__ import annotations

import csv
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer.cli import cli
from packer.samples import make_image_folder

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RUN = ("python", "bash", "console", "sh", "shell")
NORUN = re.compile(r"^<!--\s*norun\b.*-->\s*$")


def readme_blocks(text: str) -> list[tuple[int, str, str, bool]]:
    """``(line, language, code, runs)`` of every fenced block, in order."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        match = re.match(r"^```(\S*)\s*$", lines[i])
        if not match:
            i += 1
            continue
        start, language = i + 1, match.group(1)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        runs = language in RUN and not NORUN.match(before.strip())
        out.append((start, language, "\n".join(lines[i + 1 : end]), runs))
        i = end + 1
    return out


def test_block_extraction_and_marker() -> None:
    text = "x\n```python\na = 1\n```\n<!-- norun: slow -->\n```bash\npip install x\n```\n```text\nout\n```\n"
    assert readme_blocks(text) == [(2, "python", "a = 1", True), (6, "bash", "pip install x", False), (9, "text", "out", False)]


def make_inputs(root: Path) -> None:
    """The inputs the README's commands name, small."""
    make_image_folder(root / "imagenet" / "train", classes=2, per_class=3, size=(48, 64))
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat\nthe dog sat\n")
    (corpus / "b.txt").write_text("a mat for the cat\n")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "</s>", "the", "cat", "sat", "on", "mat", "dog", "a", "for"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(root / "tokenizer.json"))
    flat = make_image_folder(root / "flat", classes=2, per_class=2, size=(48, 64))
    images = root / "images"
    images.mkdir()
    rows = []
    for k, path in enumerate(sorted(flat.rglob("*.jpg"))):
        name = f"{path.parent.name}_{path.name}"
        shutil.copy(path, images / name)
        rows.append({"path": name, "label": path.parent.name, "split": "val" if k % 2 else "train"})
    for name, fields in (("train.csv", ["path", "label"]), ("all.csv", ["path", "label", "split"]), ("val.csv", ["path", "label"])):
        with open(root / name, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    with tarfile.open(root / "ILSVRC2012_img_train.tar", "w") as outer:  # a tar of tars, one per class
        for folder in sorted((root / "imagenet" / "train").iterdir()):
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as inner:
                for path in sorted(folder.iterdir()):
                    inner.add(path, arcname=path.name)
            info = tarfile.TarInfo(f"{folder.name}.tar")
            info.size = len(buffer.getvalue())
            outer.addfile(info, io.BytesIO(buffer.getvalue()))
    with tarfile.open(root / "ILSVRC2012_img_val.tar", "w") as flat_tar:
        for path in sorted(images.iterdir()):
            flat_tar.add(path, arcname=path.name)
    packer.convert(root / "imagenet" / "train", root / "old-shards", format="webdataset", workers=1)
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "imagenet-1k" / "data").mkdir(parents=True)  # as the Hugging Face Hub stores a dataset
    for split in ("train", "validation"):
        pictures = sorted((root / "imagenet" / "train").rglob("*.jpg"))
        rows = [{"image": {"bytes": p.read_bytes(), "path": p.name}, "label": k % 2} for k, p in enumerate(pictures)]
        pq.write_table(pa.Table.from_pylist(rows), root / "imagenet-1k" / "data" / f"{split}-00000-of-00001.parquet")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readme-inputs")
    make_inputs(root)
    return root


def run_shell(code: str, where: Path, line: int) -> None:
    for offset, text in enumerate(code.splitlines()):
        args = shlex.split(text, comments=True)
        if not args:
            continue
        assert args[0] == "packer", f"README line {line + offset}: {text!r} is not a packer command; mark the block <!-- norun: why -->"
        result = CliRunner().invoke(cli, args[1:], catch_exceptions=False)
        assert result.exit_code == 0, f"README line {line + offset}: {text}\n{result.output}"


def test_every_readme_block_runs_as_written(inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = [block for block in readme_blocks(README.read_text()) if block[3]]
    assert sum(language == "python" for _, language, _, _ in blocks) >= 3, "the README's Python examples were not found"
    where = tmp_path / "start"
    shutil.copytree(inputs, where)
    for n, (line, language, code, _) in enumerate(blocks):
        if language != "python":
            where = tmp_path / f"block-{n}"
            shutil.copytree(inputs, where)
        monkeypatch.chdir(where)
        if language == "python":
            try:
                exec(compile(code, f"README.md:{line}", "exec"), {"__name__": f"readme_block_{line}"})
            except Exception as exc:  # noqa: BLE001 - reported with the block's line
                raise AssertionError(f"README block at line {line} failed: {type(exc).__name__}: {exc}") from exc
        else:
            run_shell(code, where, line)


def test_quickstart_runs(tmp_path: Path) -> None:
    """The quick start, tiny: it prints the comparison it promises."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--images", "10", "--rounds", "1", "--seconds", "0.05", "--keep", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"packed / per-file, round by round: [\d.]+ \([\d.]+-[\d.]+\)x", done.stdout), done.stdout
    assert (tmp_path / "images.lmdb").exists()
