"""readers.diagnose and ``packer doctor``: the verdict follows what was slow, errors are one line,
the profiler trace (read back as Chrome-trace JSON) holds the stages' ranges. Small and fast: the
"slow" parts sleep a few ms per batch."""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import pytest
import torch
from click.testing import CliRunner

import readers
from packer import convert
from packer.cli import cli
from packer.parallel import default_workers
from readers.diagnose_loop import LoaderError, StepError, diagnose

SLEEP = 0.02  # the slow side: 20 ms a batch; the fast side costs well under 1 ms


class Batches:
    """An iterable of ``n`` batches of 8 tiny uint8 images, ``sleep`` s before each (re-iterable)."""

    def __init__(self, sleep: float = 0.0, n: int = 50, dtype: torch.dtype = torch.uint8) -> None:
        self.sleep, self.n, self.dtype = sleep, n, dtype

    def __iter__(self):
        for _ in range(self.n):
            if self.sleep:
                time.sleep(self.sleep)
            yield torch.zeros(8, 3, 4, 4, dtype=self.dtype), torch.zeros(8, dtype=torch.int64)


def fast_step(images, labels):
    images.float().sum()


def slow_step(images, labels):
    time.sleep(SLEEP)


def test_slow_loader_is_data_bound_and_the_faster_alternative_is_advised():
    d = diagnose(Batches(SLEEP), fast_step, batches=9, device="cpu", alternatives={"fast copy": (Batches(), "use the fast copy")})
    assert d.bound == "data-bound" and d.data_bound > 0.8, d
    assert d.verdict.startswith(f"data-bound: {d.data_bound:.0%} of each step waits for data")
    assert d.loader.images_per_s < 8 / SLEEP * 1.05 < d.step.images_per_s  # 8 images per 20 ms at most
    assert d.alternatives[0].measured.images_per_s > 3 * d.loader.images_per_s
    assert any(line.startswith("fast copy: ") and line.endswith("use the fast copy") for line in d.advice)
    report = str(d)
    assert "(a) loader alone" in report and "(b) step alone" in report and "(c) training loop" in report
    assert json.loads(json.dumps(d.to_dict()))["bound"] == "data-bound"


def test_fast_loader_with_slow_step_is_compute_bound():
    d = diagnose(Batches(), slow_step, batches=9, device="cpu")
    assert d.bound == "compute-bound" and d.data_bound < 0.15, d
    assert d.verdict.startswith("compute-bound") and "faster data would not help" in d.verdict
    assert d.step.images_per_s < 8 / SLEEP * 1.05 < d.loader.images_per_s
    assert d.together.images_per_s == pytest.approx(d.step.images_per_s, rel=0.3)


def test_a_packer_loader_keeps_its_epoch_and_position(lmdb_32):
    """diagnose re-iterates the loader, and each whole pass of a packer Loader moves it on an
    epoch: a training loop started after it began at epoch 18 (a rank that diagnosed alone read
    another order than the others). Its epoch and position are put back."""
    from readers import LMDBDataset, Loader

    loader = Loader(LMDBDataset(lmdb_32), 4, seed=3, threads=1)
    it = iter(loader)
    next(it)
    before = loader.state_dict()
    assert before["samples_consumed"] == 4
    diagnose(loader, fast_step, batches=12, device="cpu")
    assert loader.state_dict() == before and loader.epoch == 0
    rest = list(it)  # the user's open pass goes on (4 batches of its 5), then the next epoch follows, whole
    assert len(rest) == 4 and loader.epoch == 1 and len(list(loader)) == 5

    counted = Loader(LMDBDataset(lmdb_32), 4, seed=3, threads=1)
    for _ in zip(range(len(counted)), counted):  # a counted epoch: stopped at its last batch
        pass
    assert counted.epoch == 1
    diagnose(counted, fast_step, batches=6, device="cpu")
    assert counted.epoch == 1 and [len(list(counted)) for _ in range(3)] == [5, 5, 5]  # (an empty pass first, or epoch 0 again)
    assert counted.epoch == 4


def test_float_batches_get_measured_normalisation_advice():
    d = diagnose(Batches(SLEEP, dtype=torch.float32), fast_step, batches=6, device="cpu")
    assert d.host_normalise_ms is not None and d.host_normalise_ms > 0
    assert any("normalise on the device (readers.Normalize)" in line for line in d.advice)


def test_crashing_step_loader_and_non_batches_are_one_line_errors():
    def broken(images, labels):
        return 1 / 0

    with pytest.raises(StepError, match=r"^the step .*broken raised ZeroDivisionError: division by zero$"):
        diagnose(Batches(), broken, batches=3, device="cpu")

    def failing():
        yield torch.zeros(2, 3), torch.zeros(2)
        raise OSError("disk gone\nsecond line")

    with pytest.raises(LoaderError, match=r"raised OSError: disk gone$"):
        diagnose(type("L", (), {"__iter__": lambda self: failing()})(), fast_step, batches=6, device="cpu", warmup=0)
    with pytest.raises(LoaderError, match="yielded a int, not an \\(images, labels\\) batch"):
        diagnose([1, 2, 3], fast_step, batches=3, device="cpu")
    with pytest.raises(LoaderError, match="yielded no batches"):
        diagnose([], fast_step, batches=3, device="cpu")


def _trace_names(path: str) -> set[str]:
    with open(path) as handle:
        return {event.get("name", "") for event in json.load(handle)["traceEvents"]}


def test_trace_holds_the_loops_and_the_loaders_ranges(packed_32, tmp_path):
    loader = readers.Loader(readers.open_dataset(packed_32("blob")), 4)
    d = diagnose(loader, fast_step, batches=3, device="cpu", trace=tmp_path / "trace")
    assert d.trace is not None and d.trace.endswith(".pt.trace.json") and d.trace.startswith(str(tmp_path / "trace"))
    names = _trace_names(d.trace)
    assert {"diagnose.wait_for_batch", "diagnose.copy_to_device", "diagnose.step"} <= names
    assert {"packer.loader.wait", "packer.loader.fill"} <= names  # fill runs in the loader's threads


# -- packer doctor ---------------------------------------------------------------------------
FAST = ["--batch-size", "4", "--batches", "3", "--rounds", "3", "--step-ms", "1", "--size", "32", "-q"]
#: A packed SRC: --size (a folder's) is refused; with --step, so is --step-ms.
WITH_STEP = ["--batch-size", "4", "--batches", "3", "--rounds", "3", "-q"]
PACKED = [*WITH_STEP, "--step-ms", "1"]


def test_doctor_on_a_folder_measures_the_packed_alternative(image_folder, tmp_path):
    out = tmp_path / "doctor.json"
    result = CliRunner().invoke(cli, ["doctor", str(image_folder), "--workers", "0", "--sample", "8", "--json", str(out), *FAST])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("diagnosis of DataLoader(PILFolder, num_workers=0)") and f"wrote {out}" in result.output
    report = json.loads(out.read_text())
    assert report["command"].startswith("packer doctor") and report["cores"] >= 1
    d = report["diagnosis"]
    assert report["kind"] == "folder" and report["sample"] == 8 and report["convert_images_per_s"] > 0
    assert d["loader_name"] == "DataLoader(PILFolder, num_workers=0)" and d["sample_shape"] == [3, 32, 32]
    alt, *more = d["alternatives"]
    assert alt["label"] == "packed blob (8 images)" and alt["how"].startswith(f"packer convert {image_folder} train.blob --size 32")
    assert " s for the 18 images)" in alt["how"] and "0.0 min" not in alt["how"]  # (it said ~0.0 min)
    assert alt["measured"]["images_per_s"] > 0
    cores = default_workers()
    assert [m["label"] for m in more] == [f"num_workers={cores}"] and more[0]["measured"]["images_per_s"] > 0


def test_doctor_refuses_a_text_dataset(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("hello world\n" * 20)
    convert(tmp_path / "corpus", tmp_path / "text.blob", kind="text", workers=1)
    result = CliRunner().invoke(cli, ["doctor", str(tmp_path / "text.blob"), *PACKED])
    assert result.exit_code == 1 and result.output == (
        f"Error: {tmp_path / 'text.blob'}: a text dataset; packer doctor measures loaders of (images, labels) batches\n")


STEPS = '''
import time

calls = []

def step(images, labels):
    assert images.shape[1:] == (3, 32, 32) and images.dtype.is_floating_point is False
    time.sleep(0.02)

def broken(images, labels):
    raise RuntimeError("CUDA out of memory (pretend)")
'''


def test_doctor_on_a_blob_with_a_user_step(packed_32, tmp_path, monkeypatch):
    (tmp_path / "mysteps.py").write_text(STEPS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "mysteps", raising=False)
    out = tmp_path / "doctor.json"
    result = CliRunner().invoke(cli, ["doctor", str(packed_32("blob")), "--step", "mysteps:step", "--json", str(out), *WITH_STEP])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("diagnosis of Loader(RAMDataset, batch_size=4)") and "\nverdict: " in result.output
    d = json.loads(out.read_text())["diagnosis"]
    assert d["step"]["images_per_s"] < 4 / 0.02 * 1.05  # the user's step (20 ms a batch of 4) is what ran
    assert d["loader"]["images_per_s"] > d["step"]["images_per_s"]


@pytest.mark.parametrize(
    "step, message",
    [
        ("mysteps:broken", "Error: the step broken raised RuntimeError: CUDA out of memory (pretend)"),
        ("mysteps:nothing", "Error: --step 'mysteps:nothing': mysteps has no function 'nothing'"),
        ("nosuchmodule:step", "Error: --step 'nosuchmodule:step': cannot import 'nosuchmodule': ModuleNotFoundError"),
        ("mysteps", "Error: --step 'mysteps': expected module:function"),
    ],
)
def test_doctor_step_errors_are_one_line(packed_32, tmp_path, monkeypatch, step, message):
    (tmp_path / "mysteps.py").write_text(STEPS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "mysteps", raising=False)
    result = CliRunner().invoke(cli, ["doctor", str(packed_32("blob")), "--step", step, *WITH_STEP])
    assert result.exit_code in (1, 2) and result.output.startswith(message), result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("device, message", [
    ("gpu", "Error: --device gpu: the step runs on cpu or cuda[:N]"), ("mps", "Error: --device mps: the step runs on cpu or cuda[:N]"),
] + ([] if torch.cuda.is_available() else [("cuda", "Error: --device cuda: CUDA is not available here; use --device cpu")]))
def test_doctor_device_errors_are_one_line(packed_32, device, message):
    """--device mps and --device gpu ended in torch's traceback (a walkthrough)."""
    result = CliRunner().invoke(cli, ["doctor", str(packed_32("blob")), "--device", device, *PACKED])
    assert result.exit_code == 2 and result.output.strip() == message, result.output


def test_doctor_plot_without_matplotlib_names_the_extra(packed_32, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = CliRunner().invoke(cli, ["doctor", str(packed_32("blob")), "--plot", str(tmp_path / "p.png"), *PACKED])
    from readers.extras import install_hint

    assert result.exit_code == 1 and result.output == f"Error: --plot needs matplotlib: {install_hint('bench')}\n"
    assert not (tmp_path / "p.png").exists()


def test_doctor_plot_draws_a_png(packed_32, tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    result = CliRunner().invoke(cli, ["doctor", str(packed_32("blob")), "--plot", str(tmp_path / "p.png"), *PACKED])
    assert result.exit_code == 0, result.output
    with Image.open(tmp_path / "p.png") as image:
        assert image.format == "PNG" and image.size == (1100, 380)


def test_readers_diagnose_is_the_function_even_after_its_module_is_imported():
    import readers.diagnose_loop  # noqa: F401 - importing a submodule sets an attribute of the package

    assert readers.diagnose is diagnose and readers.Diagnosis.__name__ == "Diagnosis"


def test_example_diagnose_folder_flips_from_data_bound_to_compute_bound(tmp_path):
    """The seed-style experiment, tiny: the JPEG folder loop waits for data, the blob loop much less."""
    import os
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    args = ["--images", "12", "--size", "64", "--batch-size", "4", "--batches", "6", "--workers", "1", "--step-ms", "5", "--device", "cpu"]
    result = subprocess.run([sys.executable, str(root / "examples" / "diagnose_folder.py"), *args],
                            capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    found = re.fullmatch(r"folder: (?:partly )?data-bound, (\d+)% waiting, .*; blob: [a-z -]+, (\d+)% waiting, .*", last)  # (partly: a busy machine)
    assert found, result.stdout
    assert int(found[2]) < int(found[1]) / 2
    assert "diagnosis of the JPEG folder (PIL, 1 workers)" in result.stdout and "diagnosis of the blob (readers.Loader)" in result.stdout
    assert not any(tmp_path.glob("packer-diagnose-*"))  # the temporary folder is removed


def test_a_step_slowed_inside_the_loop_is_called_contended():
    from readers.diagnose_report import Measured, advise, verdict

    def rate(images_per_s):
        return Measured(images_per_s, images_per_s, images_per_s, images_per_s / 8, 1.0, 1.9)

    d = readers.Diagnosis("L", "cpu", 8, [3, 4, 4], "uint8", 3, 3, rate(40), rate(31), rate(23), 0.14, 0.0, 1.6, 1.9, 2, 1, 1)
    assert d.bound == "compute-bound"
    assert verdict(d).startswith("compute-bound but contended: only 14% of each step waits for data, yet a step takes x1.6")
    assert advise(d) == ["the CPU is saturated (1.9 of 2 cores busy): more workers or threads cannot help, "
                         "less work per image can (decode once, ahead of training: packer convert)"]
    d.step_slowdown = 1.1
    assert verdict(d).startswith("compute-bound: only 14%") and advise(d) == ["nothing to change on the data side"]


def test_the_expected_conversion_time_is_said_in_units_a_person_uses():
    from packer.doctor import _duration

    assert [_duration(s) for s in (0.2, 40, 89, 600, 5399, 12_600)] == ["1 s", "40 s", "89 s", "10 min", "90 min", "3.5 h"]


def test_figures_too_noisy_to_act_on_are_said_first():
    """Short runs gave 'the loop runs at 160% of the step alone' and an alternative of 388,794 img/s
    (11,408-766,180), stated as findings (the FFCV-persona walkthrough): now the advice says first
    that they are noise, and why."""
    from readers.diagnose_report import Alternative, Measured, advise

    def rate(median, low=None, high=None):
        return Measured(median, low or median, high or median, median / 8, 1.0, 0.5)

    steady = readers.Diagnosis("L", "cpu", 8, [3, 4, 4], "uint8", 3, 3, rate(40), rate(100), rate(38), 0.6, 0.0, 1.0, 0.5, 2, 1, 1)
    assert not any("noise" in line for line in advise(steady))
    fast_loop = dataclasses.replace(steady, step=rate(797), together=rate(1272), data_bound=0.0)
    assert advise(fast_loop)[0].startswith("these figures are noise, not a finding: the loop ran at 160% of its step alone")
    wide = dataclasses.replace(steady, alternatives=[Alternative("blob", "convert", rate(388_794, 11_408, 766_180))])
    first = advise(wide)[0]
    assert first.startswith("these figures are noise, not a finding: the rounds of alternative blob differ x67.2;")
    assert "more --batches or --rounds" in first


def test_doctor_refuses_fewer_batches_than_rounds_before_converting(image_folder, tmp_path):
    """It converted the sample first, then said 'batches=2, rounds=3, warmup=2: need ...', with
    exit code 1 and a name the CLI has no option for (a walkthrough)."""
    from click.testing import CliRunner

    from packer.cli import cli

    result = CliRunner().invoke(cli, ["doctor", str(image_folder), "--batches", "2", "-q"])
    assert result.exit_code == 2 and "--batches: 2 is fewer than --rounds (3)" in result.output, result.output


def test_copy_advice_is_for_a_cuda_device_only():
    """--device cpu was told to pin batches and use Loader(device='cuda') when noise made the
    'copy' share large (an options walkthrough); on CUDA the advice stands."""
    from readers.diagnose_report import Measured, advise

    def rate(images_per_s):
        return Measured(images_per_s, images_per_s, images_per_s, images_per_s / 8, 1.0, 0.5)

    on_cpu = readers.Diagnosis("L", "cpu:0", 8, [3, 4, 4], "uint8", 3, 3, rate(40), rate(100), rate(38), 0.05, 0.31, 1.0, 0.5, 2, 1, 1)
    assert not any("copying to the device" in line for line in advise(on_cpu))
    on_cuda = dataclasses.replace(on_cpu, device="cuda:0")
    assert any(line.startswith("copying to the device takes 31% of the loop") for line in advise(on_cuda))
