"""``packer preview``: a contact sheet of random samples, to see at a glance that a conversion
looks right (orientation, colour, crop). Works for every format through the torch-free stores.

A text dataset has no pictures: :func:`preview` refuses it with one line naming ``packer head``,
and :func:`document_preview` gives its first documents decoded with the recorded tokenizer
(what ``packer head`` prints); it refuses an image dataset naming ``packer preview``. For a
text dataset ``packer preview`` prints those documents, and refuses the options that only draw
a contact sheet (:data:`SHEET_OPTIONS`: :func:`refuse_sheet_options`), never drops them.
"""

from __future__ import annotations

import math
import os
import shlex
from pathlib import Path
from typing import Iterable

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from readers.formats import open_store
from readers.formats.base import Store
from readers.formats.tokens import TokenStore
from readers.tokenizer import TokenizerError

from .destination import is_packer_dataset
from .errors import OptionError, OutputError, PackerError

__all__ = ["contact_sheet", "preview", "document_preview", "refuse_sheet_options", "SHEET_OPTIONS"]

CAPTION_HEIGHT = 14
PADDING = 4
BACKGROUND = (32, 32, 32)

#: ``packer preview``'s options that only draw a contact sheet: parameter name -> as the CLI spells it.
SHEET_OPTIONS = {"output": "-o/--output", "seed": "--seed", "tile": "--tile"}


def contact_sheet(path: str | Path, *, count: int = 16, seed: int = 0, tile: int = 128) -> Image.Image:
    """A grid of ``count`` random samples of the dataset at ``path``, each captioned ``index: class``.

    Samples are drawn without replacement with ``seed``; each is scaled to fit a ``tile`` x
    ``tile`` cell, keeping its aspect ratio (small images are enlarged without smoothing).
    """
    if count < 1:
        raise OptionError(f"--count: must be at least 1, got {count}")
    if tile < 16:
        raise OptionError(f"--tile: must be at least 16 pixels, got {tile}")
    store = open_store(path)
    _require_images(store)
    n = len(store)
    indices = sorted(np.random.default_rng(seed).choice(n, size=min(count, n), replace=False).tolist())
    columns = math.ceil(math.sqrt(len(indices)))
    rows = math.ceil(len(indices) / columns)
    cell_w, cell_h = tile + PADDING, tile + CAPTION_HEIGHT + PADDING
    sheet = Image.new("RGB", (columns * cell_w + PADDING, rows * cell_h + PADDING), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    classes = store.meta.classes
    for slot, (index, (pixels, label)) in enumerate(zip(indices, store.read_samples(indices))):
        image = Image.fromarray(pixels[0] if pixels.shape[0] == 1 else pixels.transpose(1, 2, 0)).convert("RGB")
        image = _fit_image(image, tile)
        x = PADDING + (slot % columns) * cell_w
        y = PADDING + (slot // columns) * cell_h
        sheet.paste(image, (x + (tile - image.width) // 2, y + (tile - image.height) // 2))
        name = classes[label] if 0 <= label < len(classes) else "unlabeled"
        draw.text((x, y + tile + 1), _fit(draw, f"{index}: {name}", font, tile), fill=(230, 230, 230), font=font)
    return sheet


def preview(path: str | Path, out: str | Path, *, count: int = 16, seed: int = 0, tile: int = 128) -> Path:
    """Write :func:`contact_sheet` of ``path`` to the image file ``out`` (its type by suffix:
    .png, .jpg, or any other Pillow writes). Written beside ``out`` under a temporary name, then
    renamed: Pillow opens the file before its writer can fail (``.h5``: a stub that cannot write),
    and an existing file of that name, a packer dataset too, was left empty. ``out`` naming a
    packer dataset, or the dataset previewed, is refused."""
    out = Path(out)
    image_type = _image_type(out)
    if is_packer_dataset(out) or (out.exists() and out.resolve() == Path(path).resolve()):
        raise OptionError(f"-o {out}: a packer dataset, not an image file; choose another name (.png or .jpg)")
    sheet = contact_sheet(path, count=count, seed=seed, tile=tile)
    staged = out.with_name(f".{out.name}.packer-preview")
    try:
        sheet.save(staged, format=image_type)
        os.replace(staged, out)
    except OSError as exc:
        raise OutputError(f"{out}: cannot write ({exc.strerror or exc})") from None
    finally:
        if staged.exists():
            staged.unlink()
    return out


def _image_type(out: Path) -> str:
    """Pillow's name of the image type ``out``'s suffix names, if Pillow can write it (else one line)."""
    Image.init()
    image_type = Image.registered_extensions().get(out.suffix.lower())
    writer = Image.SAVE.get(image_type or "")
    if writer is None or writer.__module__.endswith("StubImagePlugin"):  # (HDF5, GRIB, BUFR: Pillow identifies, cannot write)
        what = f"Pillow cannot write {image_type} images" if image_type else "unknown image type"
        raise OptionError(f"-o {out}: {what}; use a .png or .jpg name")
    return image_type


def document_preview(path: str | Path, *, count: int = 3, tokenizer: str | None = None, chars: int = 2000) -> str:
    """The first ``count`` documents of the text dataset at ``path``, each under a
    ``--- document i (n tokens, from SOURCE)`` line (its recorded source name, where there is one), decoded with its recorded tokenizer (or ``tokenizer``,
    checked against the recorded sha256), each cut after ``chars`` characters (0: whole) with a
    line saying how many more there are (a book printed whole filled the terminal)."""
    if count < 1:
        raise OptionError(f"-n: must be at least 1, got {count}")
    if chars < 0:
        raise OptionError(f"--chars: must be 0 (whole documents) or more, got {chars}")
    if tokenizer is not None and str(tokenizer) != "bytes" and not Path(tokenizer).is_file():  # (it said '[Errno 2] ...')
        raise OptionError(f"--tokenizer {tokenizer}: no such file (the tokenizer.json or .model the dataset was converted with)")
    opened = open_store(path)
    meta = opened.meta
    if meta.kind != "text":
        raise PackerError(f"{path}: an {meta.kind} dataset ({meta.count:,} samples) has no documents to print: "
                          f"see a contact sheet of its samples with: packer preview {path}")
    try:
        store = TokenStore(path)
        eos, bos = (meta.tokenizer or {}).get("eos_id"), (meta.tokenizer or {}).get("bos_id")
        names = opened.source_names() or []  # (a dataset written before names were recorded: none)
        parts = []
        for i in range(min(count, len(store))):
            ids = store.document(i)
            ends = eos is not None and len(ids) > 0 and int(ids[-1]) == eos  # its end-of-document id: not text (bytes showed a newline)
            begins = bos is not None and len(ids) > 0 and int(ids[0]) == bos  # (its --bos: not text either)
            text = store.decode(ids[int(begins) : len(ids) - int(ends)], tokenizer)
            if chars and len(text) > chars:
                text = f"{text[:chars]}\n[... {len(text) - chars:,} more characters; --chars 0 prints whole documents]"
            source = f", from {names[i]}" if i < len(names) else ""
            parts.append(f"--- document {i} ({len(ids):,} tokens{source})\n{text}")
    except TokenizerError as exc:
        raise PackerError(str(exc)) from None
    return "\n".join(parts)


def refuse_sheet_options(path: str | Path, given: Iterable[str]) -> None:
    """One line (:class:`OptionError`, exit 2) when ``given`` names any of :data:`SHEET_OPTIONS`
    for the text dataset at ``path``: it has no images, so there is no sheet to write, seed or size."""
    named = [SHEET_OPTIONS[name] for name in SHEET_OPTIONS if name in set(given)]
    if named:
        raise OptionError(f"{', '.join(named)}: {path} is a text dataset, with no images to draw; packer preview prints its "
                          f"first documents instead (--count: how many), as packer head does: drop {'it' if len(named) == 1 else 'them'}")


def _require_images(store: Store) -> None:
    """One line, not a misread, for a dataset of token ids."""
    if store.meta.kind != "image":
        raise PackerError(
            f"{store.path}: a {store.meta.kind} dataset ({store.meta.count:,} documents) has no images for a contact sheet: "
            f"print its first documents, decoded, with: packer head {shlex.quote(str(store.path))}"
        )


def _fit_image(image: Image.Image, tile: int) -> Image.Image:
    """Scale to fit a ``tile`` square: antialiased down, nearest up (stored pixels stay visible)."""
    scale = min(tile / image.width, tile / image.height)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    resample = Image.Resampling.NEAREST if scale > 1 else Image.Resampling.LANCZOS
    return image.resize(size, resample)


def _fit(draw: ImageDraw.ImageDraw, text: str, font: ImageFont.ImageFont, width: int) -> str:
    """``text`` cut with an ellipsis to fit ``width`` pixels."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "...", font=font) > width:
        text = text[:-1]
    return text + "..."
