"""``packer bench`` and ``packer doctor`` on a folder holding a damaged image: the conversion skips
it, and the raw-folder side leaves out the same inputs (packer's own verdict, not a second rule),
so both sides read the same images; the report says how many each side skipped. It used to end
in a traceback (``OSError: Truncated File Read``) from the raw-folder timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer.bench as bench
from packer import ImageOptions
from packer.bench import RAW_FOLDER, run_bench
from packer.cli import cli
from packer.samples import make_image_folder

FAST = ["--size", "32", "--seconds", "0.05", "--repeats", "1", "--workers", "1", "--quiet"]


def damaged_folder(root: Path, *, good: int = 4) -> Path:
    """``good`` 64x48 JPEGs in ``a/`` and ``a/broken.jpg``: the first 500 bytes of one of them."""
    src = make_image_folder(root, classes=1, per_class=good, size=(48, 64))
    (folder,) = [p for p in src.iterdir() if p.is_dir()]
    (folder / "broken.jpg").write_bytes(next(folder.glob("*.jpg")).read_bytes()[:500])
    return src


def record_baseline(monkeypatch) -> list[list[tuple[str, int]]]:
    """The items each raw-folder dataset of the bench is made of."""
    made: list[list[tuple[str, int]]] = []
    real = bench.folder_baseline
    monkeypatch.setattr(bench, "folder_baseline", lambda items, image: made.append(list(items)) or real(items, image))
    return made


def test_bench_skips_a_damaged_image_on_both_sides_and_says_so(tmp_path: Path, monkeypatch) -> None:
    src = damaged_folder(tmp_path / "images")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    baseline = record_baseline(monkeypatch)
    result = CliRunner().invoke(cli, ["bench", str(src), "--sample", "5", "-f", "blob", "--tmp-dir", str(scratch), *FAST])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| raw folder") or line.startswith("| blob")]
    assert len(rows) == 5 and all("images/s" not in row and "(" in row.split("|")[3] for row in rows), result.output  # all measured
    (note,) = [line for line in result.output.splitlines() if line.startswith("Skipped as undecodable")]
    assert "of the 5 sampled: raw folder 1, blob (raw) 1; first: " in note, note
    assert "broken.jpg: not a readable image" in note, note
    assert "for 4 images" in result.output  # the blob holds 4: its size per image is per image it holds
    (items,) = baseline
    assert sorted(Path(path).name for path, _ in items) == sorted(p.name for p in (src / "class_00").glob("img_*.jpg"))
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("writers", ["converted", "none available"])
def test_the_raw_folder_leaves_out_what_the_conversion_skips_by_its_own_rule(tmp_path: Path, monkeypatch, writers: str) -> None:
    """The verdict is the conversion's: an image over ``max_pixels`` (Pillow reads it fine) is left
    out of the raw folder too, whether the skips come from a conversion or, with no writer to
    convert, from the conversion's work unit run on the sample."""
    src = damaged_folder(tmp_path / "images")
    big = src / "class_00" / "big.jpg"
    make_image_folder(tmp_path / "big", classes=1, per_class=1, size=(100, 100))
    big.write_bytes(next((tmp_path / "big").rglob("*.jpg")).read_bytes())
    if writers == "none available":
        import packer.writers

        def unavailable(name):
            raise ImportError(f"no {name} writer here")

        monkeypatch.setattr(packer.writers, "get_writer", unavailable)
    baseline = record_baseline(monkeypatch)
    report = run_bench(src, sample=10, image=ImageOptions(size=32, max_pixels=5000), formats=["blob"], workers=1,
                       seconds=0.05, repeats=1, tmp_dir=tmp_path)
    assert [entry.path for entry in report.skipped[RAW_FOLDER]] == ["class_00/big.jpg", "class_00/broken.jpg"]
    assert "more than --max-pixels 5,000" in report.skipped[RAW_FOLDER][0].reason
    (items,) = baseline
    assert len(items) == 4 and not any(Path(path).name in ("big.jpg", "broken.jpg") for path, _ in items)
    assert {row.reader for row in report.measured if row.pipeline == RAW_FOLDER} == {"DataLoader(num_workers=0)", "DataLoader(num_workers=1)"}
    if writers == "converted":
        assert report.skipped["blob (raw)"] == report.skipped[RAW_FOLDER]
        assert json.loads(json.dumps(report.to_dict()))["skipped"]["blob (raw)"][1]["path"] == "class_00/broken.jpg"
    else:
        assert list(report.skipped) == [RAW_FOLDER] and "skipped: writer not available" in report.table()


def test_bench_on_a_folder_of_damaged_images_only_is_one_line(tmp_path: Path) -> None:
    src = damaged_folder(tmp_path / "images", good=1)
    (src / "class_00" / "img_00000.jpg").write_bytes(b"not a jpeg")
    result = CliRunner().invoke(cli, ["bench", str(src), "--sample", "5", "-f", "blob", "--tmp-dir", str(tmp_path), *FAST])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.output.strip().splitlines()[-1].startswith(f"Error: {src}: none of the 2 sampled images can be decoded (first: class_00/")


def test_doctor_leaves_out_the_damaged_image_its_sample_found_and_says_so(tmp_path: Path) -> None:
    src = damaged_folder(tmp_path / "images")
    out = tmp_path / "doctor.json"
    result = CliRunner().invoke(cli, ["doctor", str(src), "--workers", "0", "--sample", "8", "--batch-size", "2", "--batches", "2",
                                      "--rounds", "1", "--step-ms", "1", "--size", "32", "-q", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "Skipped 1 undecodable image(s) of the 5 sampled, as packer convert skips them" in result.output
    assert "first: class_00/broken.jpg: not a readable image" in result.output
    report = json.loads(out.read_text())
    assert [entry["path"] for entry in report["skipped"]] == ["class_00/broken.jpg"]
    assert report["diagnosis"]["alternatives"][0]["label"] == "packed blob (4 images)"


def test_bench_warns_of_enlargement_once_naming_the_source(tmp_path: Path, caplog) -> None:
    """Each format's conversion warned, naming the bench's scratch copy (/tmp/packer-bench-*/sample/...):
    four times with -q (an FFCV user's walkthrough)."""
    src = make_image_folder(tmp_path / "small", classes=2, per_class=3, size=(20, 20))
    with caplog.at_level("WARNING", logger="packer"):
        run_bench(src, sample=6, image=ImageOptions(size=32), formats=["blob", "lmdb"], workers=1, seconds=0.05, repeats=1, tmp_dir=tmp_path)
    said = [r.getMessage() for r in caplog.records if "will be enlarged" in r.getMessage()]
    assert len(said) == 1 and f"(e.g. {src}/class_00/" in said[0] and "packer-bench-" not in said[0], said


def test_doctor_never_reads_an_image_outside_its_sample(tmp_path: Path) -> None:
    """A truncated JPEG the sample did not pick: the folder's loader read the whole folder and
    stopped at it (``OSError: Truncated File Read``, or, from a worker, ``Caught OSError in
    DataLoader worker process 1.``, naming no file)."""
    src = make_image_folder(tmp_path / "images", classes=2, per_class=8, size=(48, 64))
    outside = src / "class_00" / "img_00001.jpg"  # an evenly spaced sample of 4 of the 16 takes every 4th
    outside.write_bytes((src / "class_00" / "img_00000.jpg").read_bytes()[:55])
    out = tmp_path / "doctor.json"
    result = CliRunner().invoke(cli, ["doctor", str(src), "--workers", "1", "--sample", "4", "--batch-size", "2", "--batches", "2",
                                      "--rounds", "1", "--step-ms", "1", "--size", "32", "-q", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["skipped"] == []


@pytest.mark.parametrize("workers", [0, 1])
def test_an_image_pil_cannot_read_stops_the_folder_loader_naming_it(tmp_path: Path, workers: int) -> None:
    from torch.utils.data import DataLoader

    from packer.bench_timing import collate
    from packer.doctor import CostStep, PILFolder
    from readers.diagnose_loop import LoaderError, diagnose

    src = damaged_folder(tmp_path / "images", good=1)
    items = [(str(path), 0) for path in sorted((src / "class_00").glob("*.jpg"))]
    loader = DataLoader(PILFolder(items, 32), batch_size=2, num_workers=workers, collate_fn=collate)
    with pytest.raises(LoaderError) as caught:
        diagnose(loader, CostStep(0), batches=1, rounds=1, device="cpu")
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    assert f"raised OSError: {src / 'class_00' / 'broken.jpg'}: " in message, message


def test_doctor_warns_of_enlargement_naming_the_source(tmp_path: Path, caplog) -> None:
    """doctor's conversion of its sample warned naming its scratch copy
    (/tmp/packer-doctor-*/sample/bird/img003.jpg; an FFCV user's walkthrough)."""
    from packer.doctor import run_doctor

    src = make_image_folder(tmp_path / "small", classes=2, per_class=3, size=(20, 20))
    with caplog.at_level("WARNING", logger="packer"):
        run_doctor(src, size=32, sample=6, workers=1, batch_size=2, batches=2, rounds=1, step_ms=1)
    said = [r.getMessage() for r in caplog.records if "will be enlarged" in r.getMessage()]
    assert len(said) == 1 and f"(e.g. {src}/class_00/" in said[0] and "packer-doctor-" not in said[0], said
