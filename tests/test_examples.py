"""The examples run end to end (as a user would start them), briefly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]


def example_runner(tmp_path: Path, name: str, *fixed: str) -> Callable[..., str]:
    """``run(*args)``: the example ``name`` with ``fixed`` and ``args`` in ``tmp_path`` (one thread
    of torch, temporary files there), its stdout; a failure shows its stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}

    def run(*args: str) -> str:
        result = subprocess.run([sys.executable, str(ROOT / "examples" / name), *fixed, *args], capture_output=True, text=True,
                                timeout=240, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    return run


def test_train_classifier_runs_a_few_steps(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_classifier.py"), "--steps", "3", "--device", "cpu"],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stopped after 3 steps" in result.stdout
    assert "RandomResizedCrop" in result.stdout and "Loader(LMDBDataset" in result.stdout
    assert not any(tmp_path.glob("packer-train-*"))  # the temporary dataset is removed


def test_train_classifier_takes_a_grayscale_dataset(tmp_path):
    """A --grayscale conversion: one channel for Normalize and the model, where it stopped at
    Normalize's 3 channel values (a walkthrough)."""
    import packer
    from packer.samples import make_image_folder

    src = make_image_folder(tmp_path / "images", classes=2, per_class=8, size=(40, 40))
    packer.convert(src, tmp_path / "gray.blob", image=packer.ImageOptions(size=32, grayscale=True), workers=1)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_classifier.py"), "--data", "gray.blob", "--steps", "2", "--size", "24",
         "--batch-size", "4", "--device", "cpu"], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stopped after 2 steps" in result.stdout and "shape=1x32x32" in result.stdout


def test_train_classifier_checkpoints_and_resumes_its_loader(tmp_path):
    """Stopped after 3 steps (batches of 16 of 72 samples), restarted with batches of 8: it carries
    on from the checkpoint's loader state, the rest of epoch 0 (24 samples: 3 steps of 8), then epoch 1."""
    run = example_runner(tmp_path, "train_classifier.py", "--device", "cpu", "--checkpoint", "ckpt.pt")

    first = run("--steps", "3")
    assert "resumed" not in first and "stopped after 3 steps" in first and (tmp_path / "ckpt.pt").exists()
    second = run("--steps", "7", "--batch-size", "8")
    assert "resumed from ckpt.pt: step 3, epoch 0, 48 samples of it consumed" in second
    assert "end of epoch 0 at step 6" in second  # the rest, 24 samples, is 3 steps of 8 (not 9)
    assert "stopped after 7 steps" in second
    third = run("--steps", "7")  # already there: it trained one step more, or failed on an unset loss
    assert "already at step 7 (--steps 7): nothing to train" in third and "stopped after" not in third
    assert "stopped after 8 steps" in run("--steps", "8")  # one step on, not two


def test_mnist_from_python_packs_a_dataset_and_trains_five_epochs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "mnist_from_python.py"), "--train", "1500", "--test", "300"],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "packed 1,500 train digits" in result.stdout and "epoch 5: loss" in result.stdout
    accuracy = float(result.stdout.split("test accuracy after 5 epochs: ")[1].split("%")[0])
    assert accuracy > 80  # chance is 10%: the labels survived packing
    assert not any(tmp_path.glob("packer-mnist-*"))  # the temporary blobs are removed


def test_train_classifier_counts_the_classes_of_a_dataset_without_class_names(tmp_path):
    """A Python dataset with no ``.classes`` converts to labeled samples and no class names: the
    example sized its model from the names (2) and failed on label 3 ('Target 3 is out of bounds')."""
    import numpy as np

    from packer import ImageOptions, convert

    samples = [(np.full((24, 24, 3), 40 * label, np.uint8), label) for label in range(5) for _ in range(4)]
    convert(samples, tmp_path / "nameless.blob", image=ImageOptions(size=16), workers=1)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_classifier.py"), "--data", str(tmp_path / "nameless.blob"), "--steps", "2",
         "--batch-size", "8", "--size", "16", "--device", "cpu"],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stopped after 2 steps" in result.stdout


def test_train_classifier_says_what_it_cannot_train_on_in_one_line(tmp_path):
    """A text dataset (an AttributeError traceback), a batch larger than the data and a missing
    GPU (tracebacks ending in the library's own line): each one line (a newcomer walkthrough)."""
    import packer

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("one document\n")
    packer.convert(corpus, tmp_path / "text.blob", workers=1)
    packer.convert(_tiny_images(tmp_path), tmp_path / "img.blob", image=packer.ImageOptions(size=16), workers=1)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    script = [sys.executable, str(ROOT / "examples" / "train_classifier.py")]
    for extra, said in [
        (["--data", "text.blob", "--device", "cpu"], "text.blob: a text dataset; this example trains an image classifier"),
        (["--data", "img.blob", "--batch-size", "999", "--device", "cpu"], "img.blob: Loader: drop_last=True drops all"),
        (["--device", "cuda:0"] if not _cuda() else None, "--device cuda:0: CUDA is not available here; use --device cpu"),
    ]:
        if extra is None:
            continue
        result = subprocess.run([*script, *extra], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
        assert result.returncode != 0 and "Traceback" not in result.stderr and said in result.stderr, result.stderr[-3000:]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _tiny_images(tmp_path: Path) -> Path:
    from packer.samples import make_image_folder

    return make_image_folder(tmp_path / "images", classes=2, per_class=4, size=(24, 24))


def test_pretrain_tokens_learns_and_a_resumed_run_is_the_uninterrupted_one(tmp_path):
    """The text path end to end: a corpus tokenised into a blob, a causal model trained on random
    windows; stopped at step 10 and run again to 20 from its checkpoint, it ends at the loss of a
    run that went to 20 at once (the loader's windows, the model and the optimizer continue)."""
    run = example_runner(tmp_path, "pretrain_tokens.py", "--block-size", "32", "--batch-size", "16")

    straight = run("--steps", "20")
    assert "packed 4,000 documents" in straight
    initial = float(straight.split("step 1: loss ")[1].split(",")[0])
    final = float(straight.split("done: 20 steps, loss ")[1].split()[0])
    assert initial > 5.0 and final < 3.0  # uniform guessing among the 257 ids: 5.549
    first = run("--steps", "10", "--checkpoint", "run.pt")
    resumed = run("--steps", "20", "--checkpoint", "run.pt")
    assert "done: 10 steps" in first and "resumed from run.pt: step 10" in resumed and "packed" not in resumed  # packed once
    assert f"done: 20 steps, loss {final:.3f}" in resumed
    assert not any(tmp_path.glob("packer-pretrain-*"))  # the temporary corpus is removed
