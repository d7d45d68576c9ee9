"""What the one conversion driver (:mod:`packer.engine`) converts: a :class:`Job` per kind of source.

A job is the source's inputs in order, what scanning them already skipped, the picklable work
unit that turns one input into a stored sample (:class:`~packer.preprocess.task.Encoded`) or a
:class:`~packer.preprocess.task.Failed`, and what only this kind knows: how a skipped input is
named, what the resume fingerprint covers, the kind's metadata fields and its report. Resume,
timeouts, crash isolation, ``--on-error``, progress, Ray and the report's counts are the
driver's, the same for every kind. A new kind of input is a new job here, never a new driver.

* :class:`ImageJob`: images with labels, from any image source (:func:`image_job` picks it):
  a class folder, local or at a URL (packer/sources/images.py); a folder or an archive with a
  label file (packer/sources/labels.py); an archive, a tar of tars or WebDataset shards
  (packer/sources/archives.py); a map-style Python dataset (packer/sources/datasets.py). The
  sources differ in how inputs are found and named, what identifies them for ``--resume`` and
  the work unit that reads one (an image file, an archive member, ``dataset[i]``); the job
  and the driver are the same.
* :class:`~packer.text.TextJob`: a text corpus, tokenised (:func:`packer.text.text_job`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence

from readers.encodings import get_encoding
from readers.formats.base import local_path
from readers.schema import KINDS, Skipped

from .errors import OptionError, SourceError
from .options import ImageOptions, SourceOptions
from .parallel import is_timeout
from .preprocess.task import UNREACHABLE, Encoded, Failed, ImageTask
from .report import ConversionReport
from .sources.images import ImageFolder, scan_image_folder, warn_one_class_of_class_folders
from .sources.remote import is_source_url, remote_chunksize, store_answers
from .sources.rules import warn_of_empty_classes
from .writers.base import Writer
from .writers.fingerprint import conversion_fingerprint

__all__ = ["Job", "ImageJob", "image_job", "resolve_kind", "check_kind_options", "changed_fields", "source_fields", "ENLARGEMENT"]

log = logging.getLogger("packer")

#: A conversion worker before its input: interpreter, numpy, OpenCV, Pillow, the tokenizer.
WORKER_BASE_BYTES = 128 << 20


@dataclass
class Job:
    """One conversion's inputs and the kind-specific parts of its driving (see the module doc)."""

    #: ``"image"`` or ``"text"`` (:data:`readers.schema.KINDS`), as the metadata records it.
    kind: ClassVar[str] = ""
    #: What one input is called in messages, and the progress bar's unit.
    noun: ClassVar[str] = "input"
    unit: ClassVar[str] = "it"
    #: The source as the metadata records it: an absolute path, or a URL.
    source: str
    #: The inputs, in output order.
    items: Sequence[Any]
    #: Work unit: one input in, an :class:`Encoded` sample or a :class:`Failed` out (picklable).
    task: Callable[[Any], Encoded | Failed]
    #: Inputs left out while scanning, with the reason.
    skipped: list[Skipped] = field(default_factory=list)
    #: Image options: preprocessing for images; for other kinds the defaults (raw, any shape),
    #: which is what WebDataset pieces need to know of them.
    image: ImageOptions = field(default_factory=ImageOptions)
    #: What the driving process does to the work units' outcomes, in order, before the writer
    #: gets them (``--decode-device cuda``'s GPU stage: packer/gpu_stage.py); ``None``: nothing.
    stage: Callable[[Iterable[Any]], Iterable[Encoded | Failed]] | None = None

    @property
    def scan_skips_fail(self) -> bool:
        """Whether ``--on-error fail`` stops at ``skipped[0]``, an input scanning skipped, before
        any output is opened (the driver's check), or only at inputs the workers fail on. Text:
        any (an undecodable file is an input error); images: see :meth:`ImageJob.scan_skips_fail`."""
        return False

    def name(self, item: Any) -> str:
        """How a skipped ``item`` is recorded (relative to the source)."""
        raise NotImplementedError

    def worker_bytes(self) -> int:
        """Memory one worker may need at its peak (the driver caps the worker count by it)."""
        return WORKER_BASE_BYTES

    def crashed(self, item: Any, reason: str) -> Failed:
        """The outcome of an input that killed or hung its worker: skipped, with the reason."""
        return Failed(item.path, reason)

    def chunksize(self, workers: int | None) -> int | None:
        """Inputs per work unit sent to a worker (``None``: the pool's choice)."""
        return None

    def fingerprint_parts(self) -> tuple[Iterable[tuple[str, int]], Mapping[str, Any], Mapping[str, str] | None]:
        """What ``--resume`` must find unchanged, besides format, DST and storage options:
        ``(listing of (path, label), options by their CLI names without dashes, stamps)``."""
        raise NotImplementedError

    def metadata_fields(self, writer: Writer) -> dict[str, Any]:
        """The :class:`~readers.schema.Metadata` fields only this kind fills in."""
        raise NotImplementedError

    def fixed_shape(self) -> tuple[int, int, int] | None:
        """The (C, H, W) every stored raw uint8 sample has, when the options fix it (``None``:
        it varies, or samples are encoded): such samples may be written by the workers
        (packer/placement.py)."""
        return None

    def expected_sample_bytes(self) -> int | None:
        """About how many bytes a stored sample's payload takes (``None``: no telling), for a
        writer that cuts its output by bytes (WebDataset's ``--shard-bytes``) to plan by."""
        return None

    def report(self, **counts: Any) -> ConversionReport:
        """The report, from the driver's counts."""
        return ConversionReport(**counts)

    def fingerprint(self, fmt: str, dst: Path, storage: Mapping[str, Any], on_error: str) -> dict[str, Any]:
        """The resume fingerprint (packer/writers/journal.py)."""
        listing, options, stamps = self.fingerprint_parts()
        return conversion_fingerprint(fmt, self.source, listing, options, storage, on_error, dst, stamps)


@dataclass
class ImageJob(Job):
    """Images and their labels from any image source (see the module doc): ``folder`` is what
    scanning the source found (for an archive or a dataset too, the same record)."""

    kind: ClassVar[str] = "image"
    noun: ClassVar[str] = "image"
    unit: ClassVar[str] = "img"

    folder: ImageFolder | None = None
    #: What else ``--resume`` must find unchanged: a label file's digest and columns, a dataset's identity.
    identity: Mapping[str, Any] = field(default_factory=dict)

    @property
    def scan_skips_fail(self) -> bool:
        """Only when scanning refused a symlink (or class folder) that would give a class folder
        another class's images, or could not list a folder (its images cannot be read, as an
        unreadable file's cannot): input errors (README, *Bad input*), listed first in ``skipped``
        (packer/sources/images.py). An image outside any class folder, a symlink loop, a label
        file's unusable row are the labelling rules at work, recorded, never conversion errors."""
        return self.folder is not None and bool(self.folder.refused)

    def name(self, item: Any) -> str:
        assert self.folder is not None
        return self.folder.relative(item.path)

    def worker_bytes(self) -> int:
        """The base plus an image of ``--max-pixels`` decoded (3 bytes a pixel) and resized from."""
        return WORKER_BASE_BYTES + 2 * 3 * self.image.max_pixels

    def crashed(self, item: Any, reason: str) -> Failed:
        """As any job's; but an input of a URL SRC that timed out while its store does not answer
        stops the conversion (resumable), as a read the store refused does: a stalled server made
        every input time out in turn, each skipped for good."""
        if is_timeout(reason) and is_source_url(item.path) and not store_answers(item.path):
            return Failed(item.path, reason, stop=UNREACHABLE)
        return Failed(item.path, reason)

    def chunksize(self, workers: int | None) -> int | None:
        if self.items and is_source_url(self.items[0].path):  # each chunk starts with a round trip
            return remote_chunksize(len(self.items), workers)
        return self.folder.chunk if self.folder is not None else None  # (a Parquet row group's rows)

    def fingerprint_parts(self) -> tuple[Iterable[tuple[str, int]], Mapping[str, Any], Mapping[str, str] | None]:
        assert self.folder is not None
        return ((item.path, item.label) for item in self.items), {**self.image.describe(), **self.identity}, self.folder.stamps

    def fixed_shape(self) -> tuple[int, int, int] | None:
        size = self.image.output_size
        if size is None or self.image.encoding != "raw" or self.stage is not None:  # a GPU stage makes them in the driver
            return None
        return (self.image.channels, *size)

    def expected_sample_bytes(self) -> int | None:
        """Raw: the pixels; jpeg/png: a typical file of that size (the encoding's ratio)."""
        size = self.image.output_size
        if size is None:
            return None
        return size[0] * size[1] * self.image.channels // get_encoding(self.image.encoding).ratio

    def metadata_fields(self, writer: Writer) -> dict[str, Any]:
        assert self.folder is not None
        from .sources.parquet_images import ParquetImages

        preprocessing = self.image.describe()
        if isinstance(self.folder, ParquetImages):  # the columns read (verify --source reads the same ones)
            preprocessing["parquet"] = dict(self.folder.columns)
        return {
            "channels": self.image.channels,
            "shape": writer.shape,
            "encoding": self.image.encoding,
            "classes": tuple(self.folder.classes),
            "labeled": self.folder.labeled,
            "preprocessing": preprocessing,
        }

    def report(self, **counts: Any) -> ConversionReport:
        return ConversionReport(encoding=self.image.encoding, classes=tuple(self.folder.classes), labeled=self.folder.labeled, **counts)


def image_job(src: Any, image: ImageOptions, source: SourceOptions | None = None, *, workers: int | None = None,
              advise: bool = True) -> ImageJob:
    """The job of converting the images of ``src`` with ``image`` options: a class folder (a path
    or a URL), a folder or archive with ``source.labels``, an archive, a folder of WebDataset
    shards, or a map-style Python dataset. ``workers``: for listing the inner archives of a tar of tars;
    ``advise``: warn of what a conversion's options or layout may get wrong (enlarged inputs, one
    class folder of class folders, text files left out): ``packer verify --source`` does not."""
    source = source if source is not None else SourceOptions()
    from .sources.datasets import is_python_dataset

    if is_python_dataset(src):
        return _dataset_job(src, image, source)
    from .sources.archives import is_archive, scan_archive
    from .sources.shards import is_shard_folder, scan_shards
    from .sources.labels import read_label_rows
    from .sources.parquet_images import parquet_image_source, scan_parquet_images

    table = read_label_rows(source) if source.labels is not None else None
    identity = table.identity if table is not None else {}
    class_list = None
    if source.classes is not None:  # read before the scan (a tar of tars lists for a while): a bad list says so first
        from .sources.class_list import read_class_list

        class_list = read_class_list(source.classes)
        digest = hashlib.sha256("\n".join(class_list).encode()).hexdigest()[:12]  # (a resume refusal names it, not 1,000 names)
        identity = {**identity, "classes": f"{source.classes} ({len(class_list):,} classes, sha256 {digest})"}  # only when given
    parquet = parquet_image_source(src)
    if parquet is not None:
        if table is not None:
            raise OptionError(f"--labels: {src} is Parquet files, whose labels are their label column; drop it")
        from .preprocess.members import ParquetRowTask

        folder = scan_parquet_images(src, parquet, image_column=source.image_column, label_column=source.label_column, split=source.split)
        identity = {**identity, **folder.columns}
        task: Callable[[Any], Encoded | Failed] = ParquetRowTask(image)
    elif not is_source_url(str(src)) and (is_archive(src) or (table is None and is_shard_folder(src))):
        from .preprocess.members import MemberTask

        folder = scan_archive(src, table, workers) if is_archive(src) else scan_shards(src)
        task = MemberTask(image)
    elif table is not None:
        folder = _labeled_folder(src, table)
        task = ImageTask(image)
    else:
        folder = scan_image_folder(src)
        task = ImageTask(image)
        if advise:
            _warn_if_one_class_of_class_folders(folder, src)
            _warn_of_text_beside_images(folder, src)
    if advise and not is_source_url(str(src)) and not isinstance(folder.root, str):  # local files: their headers are cheap to read
        _warn_of_enlargement(folder.items, image)
    warn_of_empty_classes(folder.root, folder.empty_classes)
    if class_list is not None and source.classes is not None:  # numbered as another conversion's classes
        from .sources.class_list import with_class_list

        folder = with_class_list(folder, class_list, source.classes)
    return ImageJob(folder.source, folder.items, task, list(folder.skipped), image, folder=folder, identity=identity)


def _warn_if_one_class_of_class_folders(folder: ImageFolder, src: Any) -> None:
    """A folder SRC one level too high (:func:`~packer.sources.images.warn_one_class_of_class_folders`)."""
    if folder.labeled and len(folder.classes) == 1:
        [name] = folder.classes
        subfolders = {relative.split("/")[1] for item in folder.items if (relative := folder.relative(item.path)).count("/") >= 2}
        warn_one_class_of_class_folders("every image", name, subfolders, f"convert {str(src).rstrip('/')}/{name} instead")


def _warn_of_text_beside_images(folder: ImageFolder, src: Any) -> None:
    """A flat folder of images and text files converts its images: the text files it leaves out
    are said, with how to convert them instead (class folders' text files are their own notes)."""
    from .sources.text import TEXT_EXTENSIONS

    if folder.labeled or isinstance(folder.root, str):
        return
    with os.scandir(folder.root) as entries:
        texts = sum(1 for e in entries if not e.name.startswith(".") and os.path.splitext(e.name)[1].lower() in TEXT_EXTENSIONS)
    if texts:
        log.warning("%s: %s left out: it holds images, which are converted; to convert the text instead, pass --kind text",
                    src, f"{texts:,} text files ({', '.join(TEXT_EXTENSIONS)}) are" if texts != 1 else "1 text file is")


#: Inputs whose headers are read to tell whether the output size enlarges them.
ENLARGEMENT_SAMPLE = 100
#: The EXIF tag of a picture's orientation (5-8: turned a quarter).
_ORIENTATION = 0x0112


#: The enlargement warning's log record attribute: the input it names (packer bench says it once).
ENLARGEMENT = "packer_enlarged_input"


def _warn_of_enlargement(items: Sequence[Any], image: ImageOptions) -> None:
    """Say when the output size enlarges inputs (``--size 512`` on 160x120 images wrote 512x512
    without a word: upsampling adds bytes, not detail), from the headers of up to
    :data:`ENLARGEMENT_SAMPLE` inputs spread over the list (a few ms)."""
    if image.size is None or not items:
        return
    from PIL import Image

    from .preprocess.geometry import plan_for

    sample = items[:: max(1, len(items) // ENLARGEMENT_SAMPLE)][:ENLARGEMENT_SAMPLE]
    read, enlarged = 0, []
    for item in sample:
        try:
            if not stat.S_ISREG(os.stat(item.path).st_mode):  # a FIFO named .jpg would block the open: the conversion skips it
                continue
            with warnings.catch_warnings(), Image.open(item.path) as opened:
                warnings.simplefilter("ignore")  # (Pillow's DecompressionBombWarning: the conversion has its own --max-pixels)
                (width, height), turned = opened.size, getattr(opened, "_tile_size", opened.size) != opened.size  # (a TIFF's: turned by Pillow)
                if opened.getexif().get(_ORIENTATION, 1) in (5, 6, 7, 8) and not turned:  # shown turned a quarter, as converted
                    width, height = height, width
        except Exception:  # noqa: BLE001 - an unreadable input is the conversion's to report
            continue
        read += 1
        plan = plan_for(image.resize_mode, height, width, image.size, image.resize)
        if plan.resize[0] > plan.crop[2] or plan.resize[1] > plan.crop[3]:
            enlarged.append((item.path, width, height))
    if enlarged:
        path, width, height = enlarged[0]
        options = f"--size {image.size[0]}x{image.size[1]}" + (f" --resize {image.resize}" if image.resize else "")
        if image.resize_mode != "center-crop":
            options += f" --resize-mode {image.resize_mode}"
        log.warning("%d of %d inputs sampled are smaller than %s needs and will be enlarged (e.g. %s, %dx%d, width x height): "
                    "upsampling adds bytes, not detail; smaller sizes keep them as they are", len(enlarged), read, options, path, width, height,
                    extra={ENLARGEMENT: path})


def _labeled_folder(src: Any, table: Any) -> ImageFolder:
    """The images of the local folder ``src`` that the label file ``table`` names, with its labels."""
    from .errors import SourceError
    from .sources.images import ImageItem, image_files
    from .sources.labels import labeled_items, match_rows

    root = Path(src)
    if is_source_url(str(src)) or not root.is_dir():
        raise SourceError(f"{src}: with --labels, SRC must be a local folder of images or an archive (.tar, .tar.gz, .zip)")
    matched = match_rows(table, image_files(root), lambda path, label: ImageItem(path, label), str(src))
    return ImageFolder(root, labeled_items(matched, table, src), table.classes, True, matched.skipped)


def _dataset_job(dataset: Any, image: ImageOptions, source: SourceOptions) -> ImageJob:
    """The job of converting a map-style Python dataset (packer/sources/datasets.py)."""
    from .preprocess.dataset_task import DatasetTask
    from .sources.datasets import dataset_identity, scan_dataset

    folder, reader, portable, needs_main = scan_dataset(dataset, source)
    task = DatasetTask(image, reader if portable else None, folder.labeled, tuple(folder.classes), needs_main)
    identity = {"dataset": dataset_identity(dataset, reader), "image_column": reader.image_column, "label_column": reader.label_column}
    return ImageJob(folder.source, folder.items, task, [], image, folder=folder, identity=identity)


def resolve_kind(src: str | Path, kind: str | None, text_given: bool = False) -> str:
    """``kind`` if given, else ``"text"`` when SRC is a corpus (text files and no images, or no images and ``text_given``), else ``"image"``."""
    from .sources.text import is_text_corpus
    from .sources.rules import holds_no_images
    from .sources.datasets import is_python_dataset
    from .sources.shards import is_shard_folder

    if is_python_dataset(src):
        if kind not in (None, "image"):
            raise OptionError(f"--kind {kind}: a Python dataset is converted as images only so far")
        return "image"
    if kind is not None:
        if kind not in KINDS:
            raise OptionError(f"--kind: must be one of {', '.join(KINDS)}, got {kind!r}")
        return kind
    from .sources.parquet_images import parquet_image_source

    if isinstance(src, str) and src[:7].lower() == "file://":  # (packer.convert reads a file:// corpus at its local path)
        src = local_path(src)
    if parquet_image_source(src) is not None:  # (Parquet files are a text corpus unless they hold images)
        return "image"
    if not is_source_url(str(src)) and is_shard_folder(src):  # (img2dataset writes a .parquet of captions beside each shard)
        return "image"
    local = not is_source_url(str(src)) and Path(src).exists()  # (text options given for a folder of neither: a corpus)
    return "text" if local and (is_text_corpus(src) or text_given and holds_no_images(src)) else "image"


def check_kind_options(src: Any, kind: str | None, *, image: Sequence[str] = (), text: Sequence[str] = ()) -> None:
    """Refuse, in one line, options given for the other kind of source than ``src``'s (as
    :func:`resolve_kind` finds it): ``image`` and ``text`` are the image and text options given,
    as CLI names, whatever their values (a default typed out is refused too: never dropped)."""
    if not image and not text:
        return
    if text and isinstance(src, (str, os.PathLike)) and not is_source_url(str(src)) and not os.path.lexists(local_path(str(src))):
        raise SourceError(f"{src}: no such folder or file")  # (not "text options do not apply to an image folder")
    if resolve_kind(src, kind, text_given=bool(text)) == "image":
        if text:
            raise OptionError(f"{src}: text options ({', '.join(text)}) do not apply to an image folder; drop them, or pass --kind text")
    elif image:
        raise images_only(image[0], src, kind)



def images_only(option: str, src: Any, kind: str | None) -> OptionError:
    """The refusal of an image option for the text corpus ``src``: saying why it is one when
    that was found, not asked (a folder of a labels.txt and a CSV is one: it holds no images)."""
    if kind == "text":
        return OptionError(f"{option}: applies to images only, and --kind text reads {src} as a text corpus; drop it")
    return OptionError(f"{option}: applies to images only, and {src} holds no images, only text files, so it is read as a "
                       "text corpus; drop it, or give a folder of images")


def source_fields(src: Any, source: SourceOptions) -> tuple[str, ...]:
    """The :class:`SourceOptions` fields that apply to ``src`` (others given are refused)."""
    from .sources.datasets import is_python_dataset

    if is_python_dataset(src):
        return ("image_column", "label_column")
    from .sources.parquet_images import parquet_image_source

    if source.labels is None and parquet_image_source(src) is not None:
        return ("image_column", "label_column", "split", "classes")
    from .sources.text import is_text_corpus

    if source.labels is None and not is_source_url(str(src)) and Path(src).exists() and is_text_corpus(src):
        return ("split", "classes")  # (--classes: refused as an image option, by the job)
    if source.labels is not None:
        return ("labels", "path_column", "label_column", "split_column", "split", "classes")
    return ("classes",)


def check_source_options(src: Any, source: SourceOptions) -> None:
    """Refuse, in one line, a :class:`SourceOptions` field given that does not apply to ``src``."""
    from .sources.datasets import is_python_dataset

    applies = source_fields(src, source)
    unused = [name for name in changed_fields(source) if name[2:].replace("-", "_") not in applies]
    if unused:
        where = ("does not apply to a Python dataset" if is_python_dataset(src) else "applies to a Python dataset or Parquet files "
                 "of images only" if unused[0] == "--image-column" else "applies with --labels only")
        raise OptionError(f"{unused[0]}: {where}; drop it")


def changed_fields(options: Any) -> list[str]:
    """The fields of an options dataclass that differ from its defaults, as CLI option names."""
    default = type(options)()
    return [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(options) if getattr(options, f.name) != getattr(default, f.name)]
