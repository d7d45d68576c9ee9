"""GPU decoding (``--decode-device cuda``, readers/nvjpeg.py, packer/gpu_stage.py), tested on the CPU.

No GPU here: the one-line errors (no CUDA, no nvImageCodec), the refusals, the resize's fidelity
(the same torch code runs on CPU tensors) and the stage's plumbing with a CPU stand-in for
nvImageCodec's decoder. What needs a real GPU is marked to skip without one.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from packer import ImageOptions, convert
from packer.cli import cli
from packer.engine import run
from packer.errors import OptionError
from packer.gpu_stage import Fetched, FetchMemberTask, FetchTask, GPUStage, gpu_job
from packer.jobs import image_job
from packer.options import RunOptions
from packer.verify import verify
from packer.preprocess.task import Failed
from packer.preprocess.image import preprocess_image
from packer.preprocess.tensor_resize import preprocess_tensor, preprocess_tensors, resize_tensor
from readers.formats import open_store
from readers.nvjpeg import first_then, GPU_EXTRA, GPUDecoder, GPUDecodeUnavailable
from gpu_stand_in import CPUStandIn

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 10 * np.log10(255.0**2 / mse) if mse > 0 else float("inf")


# -- the one-line errors ------------------------------------------------------------------------
@no_cuda
def test_no_cuda_is_one_line():
    with pytest.raises(GPUDecodeUnavailable, match=r"no CUDA device is available") as info:
        GPUDecoder("cuda", what="--decode-device cuda")
    assert "\n" not in str(info.value) and str(info.value).startswith("--decode-device cuda:")


def test_no_library_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # import fails, as when not installed
    with pytest.raises(GPUDecodeUnavailable) as info:
        GPUDecoder("cuda")
    message = str(info.value)
    assert "\n" not in message and GPU_EXTRA in message and "nvidia-nvimgcodec-cu12" in message


def test_a_cpu_device_without_a_stand_in_is_refused():
    with pytest.raises(GPUDecodeUnavailable, match="decodes on a CUDA device"):
        GPUDecoder("cpu")


def test_importing_readers_does_not_import_the_library():
    """In a fresh interpreter: a test before this one may have loaded the library on purpose."""
    code = "import sys, readers, readers.nvjpeg, packer.gpu_stage; print('nvidia.nvimgcodec' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stderr


def test_the_workers_task_module_imports_no_torch():
    """Each worker unpickles FetchTask: importing torch there cost a 16-core host most of a conversion."""
    code = "import sys, pickle, packer.preprocess.fetch as f; from packer import ImageOptions; pickle.loads(pickle.dumps(f.FetchTask(ImageOptions(size=8)))); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stderr


def test_each_input_goes_to_the_first_decoder_that_takes_it():
    """The hardware engine first, the other backends for what it refuses: order kept, one call each."""
    calls = []

    def refusing(odd: bool):
        def decode(items):
            calls.append(list(items))
            return [None if (x % 2 == 1) == odd else f"d{x}" for x in items]
        return decode

    assert first_then([refusing(True), refusing(False)], [0, 1, 2, 3, 4]) == ["d0", "d1", "d2", "d3", "d4"]
    assert calls == [[0, 1, 2, 3, 4], [1, 3]]
    calls.clear()
    assert first_then([refusing(True)], [1, 2]) == [None, "d2"]  # none took it: None, the caller's CPU fallback
    assert first_then([refusing(True), refusing(False)], [0, 2]) == ["d0", "d2"] and calls[-1] == [0, 2]  # nothing left: no second call


# -- refusals, through the CLI ------------------------------------------------------------------
def _cli(*args: str):
    return CliRunner().invoke(cli, ["convert", *args])


@no_cuda
def test_cli_without_cuda_is_one_line(image_folder, tmp_path):
    result = _cli(str(image_folder), str(tmp_path / "out.lmdb"), "--size", "32", "--decode-device", "cuda")
    assert result.exit_code != 0
    assert "--decode-device cuda: no CUDA device is available" in result.output and result.output.count("\n") == 1
    assert not (tmp_path / "out.lmdb").exists()


def test_cli_refuses_it_for_text(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world\n")
    result = _cli(str(corpus), str(tmp_path / "out.lmdb"), "--decode-device", "cuda")
    assert result.exit_code != 0 and "--decode-device: applies to images only" in result.output
    assert result.output.count("\n") == 1


@pytest.mark.parametrize("extra, says", [
    (["--executor", "ray"], "does not apply with --executor ray"),
    (["-f", "webdataset"], "does not apply to webdataset output"),
])
def test_cli_refuses_it_with_ray_and_webdataset(image_folder, tmp_path, extra, says):
    dst = tmp_path / ("out.lmdb" if "webdataset" not in extra else "shards")  # (a name that agrees with -f)
    result = _cli(str(image_folder), str(dst), "--decode-device", "cuda", *extra)
    assert result.exit_code != 0 and f"--decode-device cuda: {says}" in result.output
    assert result.output.count("\n") == 1


def test_a_python_dataset_is_refused(tmp_path):
    images = [(np.zeros((8, 8, 3), np.uint8), 0)]
    with pytest.raises(OptionError, match="does not apply to a Python dataset"):
        convert(images, tmp_path / "out.lmdb", image=ImageOptions(size=4, decode_device="cuda"))


def test_the_option_is_checked_and_recorded():
    with pytest.raises(OptionError, match="--decode-device: must be one of cpu, cuda"):
        ImageOptions(decode_device="gpu")
    assert "decode_device" not in ImageOptions(size=32).describe()  # files without it read as before
    assert ImageOptions(size=32, decode_device="cuda").describe()["decode_device"] == "cuda"


# -- the resize: the same torch code on CPU tensors -----------------------------------------------
def test_resize_fidelity_is_within_half_a_db_of_the_cpu_path(tmp_path):
    """PSNR against the float Lanczos reference of benchmarks/preprocess.py (the CPU path's
    37.8 dB figure): the GPU path's resize may not be more than 0.5 dB below the CPU path's."""
    from benchmarks.preprocess import reference

    from packer.samples import make_image_folder

    folder = make_image_folder(tmp_path / "photos", classes=1, per_class=8, size=(375, 500), seed=3)
    options = ImageOptions(size=224)
    cpu, gpu = [], []
    for path in sorted(folder.rglob("*.jpg")):
        data = path.read_bytes()
        ref = reference(data)
        decoded = torch.from_numpy(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB)).permute(2, 0, 1)
        gpu.append(psnr(preprocess_tensor(decoded, options).permute(1, 2, 0).numpy(), np.clip(ref, 0, 255)))
        cpu.append(psnr(preprocess_image(data, options), np.clip(ref, 0, 255)))
    assert np.mean(gpu) >= np.mean(cpu) - 0.5, (np.mean(gpu), np.mean(cpu))


@pytest.mark.parametrize("kwargs", [dict(size=32), dict(size=(24, 40), resize_mode="pad"), dict(size=24, resize=28), dict(size=24, resize_mode="shorter")])
def test_a_batch_is_each_image_alone_in_order(kwargs):
    """preprocess_tensors groups images by source size and resizes each group in one call: every
    output is what that image alone gives, in the input order, whatever the mix of sizes."""
    g = torch.Generator().manual_seed(0)
    sizes = [(40, 50), (50, 40), (40, 50), (33, 61), (40, 50), (50, 40)]
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sizes]
    options = ImageOptions(**kwargs)
    batched = preprocess_tensors(images, options)
    assert len(batched) == len(images)
    for image, out in zip(images, batched):
        alone = preprocess_tensors([image], options)[0]
        assert out.is_contiguous() and torch.equal(out, alone)


def test_a_large_group_is_resized_in_calls_within_the_budget(monkeypatch):
    """A batch of big same-size photos is cut into calls of at most the budget's elements (one
    image alone may pass it): the float copy stays bounded; pixels as one image alone gives."""
    import packer.preprocess.tensor_resize as tr

    calls, real = [], tr.resize_tensor
    monkeypatch.setattr(tr, "resize_tensor", lambda batch, h, w: calls.append(batch.shape[0]) or real(batch, h, w))
    g = torch.Generator().manual_seed(1)
    images = [torch.randint(0, 256, (3, 60, 80), dtype=torch.uint8, generator=g) for _ in range(7)]
    options = ImageOptions(size=16)
    crop = 3 * 60 * 60  # the centre square each image is cut to before its resize
    out = tr.preprocess_tensors(images, options, budget=3 * crop)
    assert calls == [3, 3, 1]
    assert all(torch.equal(o, tr.preprocess_tensors([i], options)[0]) for o, i in zip(out, images))
    calls.clear()
    tr.preprocess_tensors(images[:2], options, budget=crop // 2)  # smaller than one image: one at a time
    assert calls[:2] == [1, 1]
    assert tr.preprocess_tensors([], options) == []


def test_a_decoder_that_answers_for_fewer_inputs_is_an_error():
    with pytest.raises(RuntimeError, match="returned 1 images for 3 inputs"):
        first_then([lambda items: [None] * len(items), lambda items: ["x"]], [1, 2, 3])


def test_resize_tensor_keeps_size_and_dtype():
    image = torch.randint(0, 256, (3, 40, 50), dtype=torch.uint8)
    assert resize_tensor(image, 40, 50) is image
    out = resize_tensor(image, 20, 30)
    assert out.shape == (3, 20, 30) and out.dtype == torch.uint8


@pytest.mark.parametrize("kwargs", [dict(size=32), dict(size=(24, 40), resize_mode="pad"), dict(size=(24, 40), resize_mode="stretch"),
                                    dict(size=24, resize_mode="shorter"), dict(size=24, resize=28), dict(size=32, grayscale=True)])
def test_tensor_geometry_matches_the_cpu_path(image_folder, kwargs):
    """Every resize mode gives the CPU path's output shape, and pixels close to its (PSNR)."""
    options = ImageOptions(**kwargs)
    data = next(image_folder.rglob("*.jpg")).read_bytes()
    decoded = GPUDecoder("cpu", channels=options.channels, backend=CPUStandIn(options.channels)).decode([data])[0]
    out = preprocess_tensor(decoded, options).permute(1, 2, 0).numpy()
    want = preprocess_image(data, options)
    assert out.shape == want.shape
    assert psnr(out, want) > 35  # measured 37.3 (stretch) to 40.9 dB


# -- the stage's plumbing, with a CPU stand-in for the GPU decoder ----------------------------------
@pytest.fixture(scope="module")
def mixed_folder(with_bad: Path, tmp_path_factory) -> Path:
    """``with_bad`` (JPEGs and two undecodable files) plus a PNG and a truncated JPEG."""
    src = tmp_path_factory.mktemp("mixed") / "src"
    shutil.copytree(with_bad, src)
    Image.new("RGB", (70, 50), (200, 30, 90)).save(src / "class_00" / "001_png.png")
    jpeg = next((src / "class_01").glob("*.jpg")).read_bytes()
    (src / "class_02" / "005_cut.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    return src


def _samples(path: Path) -> tuple[list, list[str]]:
    store = open_store(path)
    samples = [(int(label), tuple(shape), np.frombuffer(bytes(payload), np.uint8).reshape(shape))
               for label, shape, payload in store.records(range(len(store)))]
    return samples, sorted(s.path for s in store.meta.skipped)


@pytest.mark.parametrize("fmt, suffix", [("lmdb", ".lmdb"), ("hdf5", ".h5")])
def test_a_conversion_through_the_gpu_stage_matches_the_cpu_path(mixed_folder, tmp_path, fmt, suffix, caplog):
    """Same inputs kept and skipped, same labels and shapes; each JPEG's pixels at least 35 dB PSNR
    from the CPU path's (measured: 40.5-42.6 dB, 80x60 -> 32x32), the PNG identical (decoded on the CPU)."""
    options = ImageOptions(size=32)
    cpu_dst, gpu_dst = tmp_path / f"cpu{suffix}", tmp_path / f"gpu{suffix}"
    convert(mixed_folder, cpu_dst, image=options, workers=2)
    stand_in = CPUStandIn(refuse=1)  # the first JPEG goes the CPU fallback in the driving process
    job = gpu_job(image_job(mixed_folder, options), device="cpu", backend=stand_in)
    job.stage.batch = 4  # several batches
    run(job, fmt, gpu_dst, storage=None, options=RunOptions(workers=2))
    (cpu, cpu_skipped), (gpu, gpu_skipped) = _samples(cpu_dst), _samples(gpu_dst)
    assert gpu_skipped == cpu_skipped and len(cpu_skipped) == 3  # the two bad files and the truncated JPEG
    assert [(label, shape) for label, shape, _ in gpu] == [(label, shape) for label, shape, _ in cpu]
    exact = [psnr(a[2], b[2]) == float("inf") for a, b in zip(gpu, cpu)]
    assert exact[0]  # the CPU fallback of the refused one, said in a warning
    assert sum("the GPU decoder could not decode it; converting it on the CPU" in r.getMessage() for r in caplog.records) == 1
    assert sum(exact) == 2  # and the PNG; every other sample went through the stand-in and the torch resize
    assert min(psnr(a[2], b[2]) for a, b in zip(gpu, cpu)) > 35
    assert sum(stand_in.calls) == len(cpu) - 1 and max(stand_in.calls) <= 4
    assert open_store(gpu_dst).meta.preprocessing["decode_device"] == "cuda"
    # packer verify --source re-converts on the CPU: close pixels pass (GPU_TOLERANCE), changed ones do not
    report = verify(gpu_dst, source=mixed_folder, workers=1)
    assert report.ok and report.compared == len(cpu)


def test_an_archive_goes_through_the_member_fetch_task(image_folder, tmp_path):
    """A .tar SRC: its members are read by FetchMemberTask and decoded by the stage."""
    import tarfile

    archive = tmp_path / "images.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(image_folder, arcname=".")
    options = ImageOptions(size=32)
    convert(archive, tmp_path / "cpu.lmdb", image=options, workers=1)
    job = gpu_job(image_job(archive, options), device="cpu", backend=CPUStandIn())
    assert isinstance(job.task, FetchMemberTask)
    run(job, "lmdb", tmp_path / "gpu.lmdb", storage=None, options=RunOptions(workers=1))
    (cpu, _), (gpu, _) = _samples(tmp_path / "cpu.lmdb"), _samples(tmp_path / "gpu.lmdb")
    assert [(label, shape) for label, shape, _ in gpu] == [(label, shape) for label, shape, _ in cpu] and len(cpu) == 18
    assert min(psnr(a[2], b[2]) for a, b in zip(gpu, cpu)) > 35


def test_parquet_rows_go_through_their_fetch_task(image_folder, tmp_path):
    """Parquet files of images (packer/sources/parquet_images.py): rows read by FetchParquetRowTask, decoded by the stage."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packer.preprocess.fetch import FetchParquetRowTask

    pictures = sorted(image_folder.rglob("*.jpg"))
    rows = [{"image": {"bytes": p.read_bytes(), "path": None}, "label": k % 3} for k, p in enumerate(pictures)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet", row_group_size=5)
    options = ImageOptions(size=32)
    convert(tmp_path / "a.parquet", tmp_path / "cpu.lmdb", image=options, workers=1)
    job = gpu_job(image_job(tmp_path / "a.parquet", options), device="cpu", backend=CPUStandIn())
    assert isinstance(job.task, FetchParquetRowTask)
    run(job, "lmdb", tmp_path / "gpu.lmdb", storage=None, options=RunOptions(workers=1))
    (cpu, _), (gpu, _) = _samples(tmp_path / "cpu.lmdb"), _samples(tmp_path / "gpu.lmdb")
    assert [(label, shape) for label, shape, _ in gpu] == [(label, shape) for label, shape, _ in cpu] and len(cpu) == len(pictures) > 5
    assert min(psnr(a[2], b[2]) for a, b in zip(gpu, cpu)) > 35


def test_the_fetch_task_hands_on_plain_jpegs_only(mixed_folder):
    job = image_job(mixed_folder, ImageOptions(size=32))
    task = FetchTask(job.image)
    outcomes = {str(Path(item.path).relative_to(mixed_folder)): task(item) for item in job.items}
    assert outcomes["class_00/001_png.png"].shape == (3, 32, 32)  # an Encoded sample: converted by the worker
    assert isinstance(outcomes["class_02/005_cut.jpg"], Failed)  # truncated: the CPU path's skip reason
    assert isinstance(outcomes["class_00/000_bad.jpg"], Failed)
    assert sum(isinstance(o, Fetched) for o in outcomes.values()) == 18


def test_the_stage_keeps_order_and_passes_other_outcomes_through():
    stage = GPUStage(ImageOptions(size=8), device="cpu", backend=CPUStandIn(), batch=2)
    data = {value: cv2.imencode(".jpg", np.full((16, 16, 3), value, np.uint8))[1].tobytes() for value in (50, 100, 150)}
    outcomes = ["a", Fetched("x", 1, data[50]), "b", Fetched("y", 2, data[100]), Fetched("z", 3, data[150]), "c"]
    out = list(stage(outcomes))
    assert out[0] == "a" and out[2] == "b" and out[5] == "c"
    assert [o.label for o in (out[1], out[3], out[4])] == [1, 2, 3] and out[1].shape == (3, 8, 8)
    assert [round(float(np.frombuffer(o.payload, np.uint8).mean()) / 50) for o in (out[1], out[3], out[4])] == [1, 2, 3]


@needs_gpu
def test_nvimgcodec_decodes_on_the_gpu(image_folder):  # pragma: no cover - needs a GPU and packer[gpu]
    pytest.importorskip("nvidia.nvimgcodec")
    data = [p.read_bytes() for p in sorted(image_folder.rglob("*.jpg"))[:4]]
    decoded = GPUDecoder("cuda").decode(data)
    for blob, image in zip(data, decoded):
        assert image is not None and image.is_cuda and image.dtype == torch.uint8
        want = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR_RGB)
        assert psnr(image.permute(1, 2, 0).cpu().numpy(), want) > 35
