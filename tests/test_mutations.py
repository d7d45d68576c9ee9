"""The round-trip checks can fail: each mutation of a conversion (a tokenizer that drops the last
token of every document, two samples' labels swapped, one sample silently skipped) makes the
checks the real round-trip tests use (tests/roundtrip_checks.py) raise, through the format's
plain library and through ``readers`` alike; the same conversion unmutated passes them.

The mutation is applied where the conversion's driver hands each converted sample to the
writer (``Writer.add``, in this process: the work units run in worker processes that a
monkeypatch does not reach), for the formats whose samples pass there (WebDataset workers write
their shards themselves).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import packer
from packer.options import TextOptions
from packer.preprocess.task import Encoded
from packer.writers.base import Writer
from roundtrip_checks import check_images_plain, check_images_readers, check_tokens_plain, check_tokens_readers
from test_roundtrip import expected

#: Formats whose converted samples reach the writer through ``Writer.add`` in the driver.
DRIVER_WRITTEN = ["lmdb", "hdf5", "blob"]
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob"}

Mutation = Callable[[int, Encoded], "Encoded | None"]


def drop_last_token(index: int, sample: Encoded) -> Encoded:
    """What a tokenizer that loses each document's last token would store: the ids but the last, then EOS."""
    size = np.dtype(sample.dtype).itemsize
    payload = sample.payload[: -2 * size] + sample.payload[-size:]
    return dataclasses.replace(sample, payload=payload, shape=(1, 1, sample.shape[2] - 1))


def swap_labels(first: int, second: int, labels: list[int]) -> Mutation:
    """Samples ``first`` and ``second`` stored with each other's label."""
    swapped = {first: labels[second], second: labels[first]}
    return lambda index, sample: dataclasses.replace(sample, label=swapped.get(index, sample.label))


def skip_one(skipped: int) -> Mutation:
    """Sample ``skipped`` silently never written (later samples move up one index)."""
    return lambda index, sample: None if index == skipped else sample


@pytest.fixture
def mutate(monkeypatch):
    """``mutate(mutation)``: every sample the driver adds from now on goes through ``mutation``;
    returns the list of inputs it saw (so a test knows the mutation ran)."""

    def install(mutation: Mutation) -> list[int]:
        seen: list[int] = []
        real = Writer.add

        def add(self, sample: Encoded) -> None:
            seen.append(len(seen))
            changed = mutation(seen[-1], sample)
            if changed is not None:
                real(self, changed)

        monkeypatch.setattr(Writer, "add", add)
        return seen

    return install


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[list[int]]]:
    """A small corpus and, from UTF-8 alone, its ``bytes`` tokenizer ids (EOS 256 after each)."""
    root = tmp_path_factory.mktemp("corpus")
    docs = [f"document {i}: " + "word " * (i % 5 + 1) + "end" for i in range(8)]
    for i, text in enumerate(docs):
        (root / f"d{i}.txt").write_text(text, encoding="utf-8")
    return root, [[*text.encode("utf-8"), 256] for text in docs]


def convert_text(src: Path, dst: Path, fmt: str) -> None:
    packer.convert(src, dst, format=fmt, text=TextOptions(), workers=1)


def convert_images(src: Path, dst: Path, fmt: str) -> None:
    packer.convert(src, dst, format=fmt, image=packer.ImageOptions(size=16), workers=1)


@pytest.mark.parametrize("fmt", DRIVER_WRITTEN)
def test_a_tokenizer_dropping_the_last_token_fails_the_text_checks(fmt, corpus, mutate, tmp_path):
    src, want = corpus
    good, bad = tmp_path / f"good{SUFFIX[fmt]}", tmp_path / f"bad{SUFFIX[fmt]}"
    convert_text(src, good, fmt)
    check_tokens_plain(good, want)
    check_tokens_readers(good, want)
    seen = mutate(drop_last_token)
    convert_text(src, bad, fmt)
    assert len(seen) == len(want)
    with pytest.raises(AssertionError, match="document 0"):
        check_tokens_plain(bad, want)
    with pytest.raises(AssertionError):
        check_tokens_readers(bad, want)


@pytest.mark.parametrize("fmt", DRIVER_WRITTEN)
def test_a_skipped_document_fails_the_text_checks(fmt, corpus, mutate, tmp_path):
    src, want = corpus
    dst = tmp_path / f"bad{SUFFIX[fmt]}"
    mutate(skip_one(3))
    convert_text(src, dst, fmt)
    with pytest.raises(AssertionError, match="documents, expected 8"):
        check_tokens_plain(dst, want)
    with pytest.raises(AssertionError, match="documents, expected 8"):
        check_tokens_readers(dst, want)


@pytest.mark.parametrize("fmt", DRIVER_WRITTEN)
@pytest.mark.parametrize("mutation", ["swap two labels", "skip one sample"])
def test_a_broken_image_conversion_fails_the_image_checks(fmt, mutation, image_folder, mutate, tmp_path):
    want = expected(image_folder, packer.ImageOptions(size=16))
    labels = [label for _, label in want]
    assert labels[0] != labels[-1]
    good, bad = tmp_path / f"good{SUFFIX[fmt]}", tmp_path / f"bad{SUFFIX[fmt]}"
    convert_images(image_folder, good, fmt)
    check_images_plain(good, want)
    check_images_readers(good, want)
    seen = mutate(swap_labels(0, len(want) - 1, labels) if mutation == "swap two labels" else skip_one(len(want) // 2))
    convert_images(image_folder, bad, fmt)
    assert len(seen) == len(want)
    message = "labels differ" if mutation == "swap two labels" else f"expected {len(want)}"
    with pytest.raises(AssertionError, match=message):
        check_images_plain(bad, want)
    with pytest.raises(AssertionError, match=message):
        check_images_readers(bad, want)

