"""Normalize takes 0-1 means and stds (torchvision's convention); 0-255 ones (FFCV's, DALI's) are
refused with one line giving the corrected call, and the ImageNet constants are importable from ``readers``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import readers
from readers import Normalize
from readers import gpu


def refusal(mean, std) -> str:
    with pytest.raises(ValueError) as caught:
        Normalize(mean=mean, std=std)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_0_255_mean_and_std_are_refused_with_the_fix():
    message = refusal([123.7, 116.3, 103.5], [58.4, 57.1, 57.4])
    assert "mean 123.7 is on the 0-255 scale" in message and "divide mean and std by 255" in message
    assert "Normalize(mean=[0.485098, 0.456078, 0.405882], std=[0.22902, 0.223922, 0.225098])" in message


def test_the_suggested_call_computes_what_the_0_255_values_meant():
    mean, std = [123.7, 116.3, 103.5], [58.4, 57.1, 57.4]
    message = refusal(mean, std)
    suggested = eval(message[message.index("Normalize(mean="):], {"Normalize": Normalize})  # noqa: S307 - our own message
    images = torch.randint(0, 256, (2, 3, 5, 5), dtype=torch.uint8)
    meant = (images.double() - torch.tensor(mean, dtype=torch.float64).reshape(3, 1, 1)) / torch.tensor(std, dtype=torch.float64).reshape(3, 1, 1)
    assert torch.allclose(suggested(images).double(), meant, atol=1e-4)


@pytest.mark.parametrize(
    "mean, std, says, fixed",
    [
        ([0.485, 0.456, 0.406], [58.4, 57.1, 57.4], "std 58.4 is on the 0-255 scale; ", "divide std by 255: Normalize(mean=[0.485, 0.456, 0.406], std=[0.22902"),
        ([123.7, 116.3, 103.5], [0.229, 0.224, 0.225], "mean 123.7 ", "divide mean by 255: Normalize(mean=[0.485098, 0.456078, 0.405882], std=[0.229, 0.224, 0.225])"),
        ([103.53, 116.28, 123.675], [1.0, 1.0, 1.0], "mean 103.53 ", "divide mean and std by 255: "),  # Caffe style: subtract the mean only
        ([128.0], [1.5], "mean 128 ", "Normalize(mean=[0.501961], std=[0.00588235])"),
    ],
)
def test_mixed_and_mean_only_0_255_values_are_refused(mean, std, says, fixed):
    message = refusal(mean, std)
    assert says in message and fixed in message


@pytest.mark.parametrize("mean, std", [([0.0, 0.0, 0.0], [1.0, 1.0, 1.0]), ([1.0], [1.0]), ([0.5], [0.5]), ([-0.2], [0.1])])
def test_0_1_values_at_the_edges_are_accepted(mean, std):
    Normalize(mean=mean, std=std)


def test_imagenet_constants_are_exported_lazily():
    assert readers.IMAGENET_MEAN == gpu.IMAGENET_MEAN == (0.485, 0.456, 0.406)
    assert readers.IMAGENET_STD == gpu.IMAGENET_STD == (0.229, 0.224, 0.225)
    assert {"IMAGENET_MEAN", "IMAGENET_STD"} <= set(readers.__all__) <= set(dir(readers))
    script = "import sys, readers; from readers import IMAGENET_MEAN, IMAGENET_STD; print('click' in sys.modules, 'packer' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
