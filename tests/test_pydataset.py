"""A map-style Python dataset as SRC (``packer.convert(dataset, ...)``): PIL images, numpy arrays
(HWC uint8, CHW float) and tensors give the same samples as the same pictures saved as PNG files in
class folders (read back with lmdb and tarfile themselves); a dataset that does not pickle is read
in the parent with the same result; bad samples are skipped and named ``dataset[i]``."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

import packer
from packer import ImageOptions, SourceOptions
from packer.errors import OptionError
from packer.jobs import image_job
from test_labels import lmdb_samples

CLASSES = ["cat", "dog", "eel"]


def pictures() -> list[tuple[np.ndarray, int]]:
    """3 classes x 3 small RGB pictures (one stored grayscale), (H, W, 3) uint8, and labels."""
    rng = np.random.default_rng(7)
    out = []
    for label in range(3):
        for i in range(3):
            pixels = rng.integers(0, 256, (20 + i, 24, 3), dtype=np.uint8)
            if label == 1 and i == 2:
                pixels = np.repeat(pixels[:, :, :1], 3, axis=2)
            out.append((pixels, label))
    return out


class ArrayDataset:
    """``(image, label)`` with the image as ``kind`` says; ``classes`` like torchvision's."""

    classes = CLASSES

    def __init__(self, kind: str) -> None:
        self.kind, self.items = kind, pictures()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        pixels, label = self.items[index]
        if self.kind == "pil":
            return Image.fromarray(pixels), label
        if self.kind == "chw-float":
            return pixels.transpose(2, 0, 1).astype(np.float32) / 255.0, np.int64(label)
        if self.kind == "tensor":
            return torch.from_numpy(pixels.transpose(2, 0, 1).copy()), torch.tensor(label)
        return pixels, label


class Unpicklable(ArrayDataset):
    """Holds a lambda (does not pickle); sample 2 raises, sample 4 has a label outside the classes."""

    def __init__(self) -> None:
        super().__init__("hwc")
        self.hook = lambda index: index

    def __getitem__(self, index: int):
        if self.hook(index) == 2:
            raise OSError("disk on fire")
        pixels, label = super().__getitem__(index)
        return pixels, 7 if index == 4 else label


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    """The pictures as PNG files in class folders, converted: what every dataset must give."""
    root = tmp_path_factory.mktemp("png") / "images"
    for index, (pixels, label) in enumerate(pictures()):
        (root / CLASSES[label]).mkdir(parents=True, exist_ok=True)
        image = Image.fromarray(pixels[:, :, 0], "L") if label == 1 and index % 3 == 2 else Image.fromarray(pixels)
        image.save(root / CLASSES[label] / f"{index:03d}.png")
    dst = tmp_path_factory.mktemp("ref") / "ref.lmdb"
    packer.convert(root, dst, image=ImageOptions(size=16), workers=1)
    return lmdb_samples(dst)


@pytest.mark.parametrize("kind", ["pil", "hwc", "chw-float", "tensor"])
def test_a_dataset_gives_the_class_folder_samples(reference, tmp_path, kind):
    dst = tmp_path / "out.lmdb"
    report = packer.convert(ArrayDataset(kind), dst, image=ImageOptions(size=16), workers=2)
    assert report.written == 9 and report.skipped == []
    samples, meta = lmdb_samples(dst)
    assert samples == reference[0]
    assert meta["classes"] == CLASSES and meta["source"] == "python:test_pydataset.ArrayDataset"


def test_a_dataset_holding_tensors_converts_with_several_workers(tmp_path):
    """A dataset that holds torch tensors (a TensorDataset): ForkingPickler sends a tensor as a
    descriptor that can be received once, so each worker must be sent its own pickle of the work
    unit (the second of 2 workers failed with EOFError in torch's rebuild_storage_fd)."""
    images = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (12, 3, 16, 16), dtype=np.uint8))
    labels = torch.arange(12) % 3
    outputs = {}
    for workers in (1, 2):
        dst = tmp_path / f"out-{workers}.lmdb"
        report = packer.convert(torch.utils.data.TensorDataset(images, labels), dst, image=ImageOptions(size=16), workers=workers)
        assert report.written == 12 and report.skipped == [] and report.workers == workers
        outputs[workers] = lmdb_samples(dst)[0]
    assert outputs[2] == outputs[1]
    values = list(outputs[1].values())  # each record holds its sample's raw CHW bytes (docs/FORMATS.md)
    assert all(any(images[i].numpy().tobytes() in value for value in values) for i in range(12))


def test_an_unpicklable_dataset_is_read_in_the_parent_and_bad_samples_skipped(reference, tmp_path):
    assert image_job(Unpicklable(), ImageOptions()).task.reader is None  # the parent reads it
    assert image_job(ArrayDataset("hwc"), ImageOptions()).task.reader is not None  # its workers read it
    dst = tmp_path / "out.lmdb"
    report = packer.convert(Unpicklable(), dst, image=ImageOptions(size=16), workers=2)
    samples, meta = lmdb_samples(dst)
    assert [(s["path"], s["reason"]) for s in meta["skipped"]] == [
        ("dataset[2]", "reading it raised OSError: disk on fire"), ("dataset[4]", "unknown label 7 (not a class index of its 3 classes)")]
    kept = [value for key, value in sorted(reference[0].items()) if key not in (b"0000000002", b"0000000004")]
    assert [value for _, value in sorted(samples.items())] == kept
    assert report.written == 7

    shards = tmp_path / "out.shards"  # WebDataset pieces carry the samples read here to their workers too
    packer.convert(Unpicklable(), shards, format="webdataset", image=ImageOptions(size=16), workers=2)
    with tarfile.open(shards / "shard-000000.tar") as tar:
        payloads = [np.load(io.BytesIO(tar.extractfile(m).read())).tobytes() for m in tar.getmembers() if m.name.endswith(".npy")]
    assert payloads == [value[16:] for value in kept]


class Records:
    """A Hugging Face-like dataset: records, ``column_names``, a ClassLabel-like feature."""

    class _Label:
        names = ["zero", "one", "two"]

    column_names = ["img", "fine", "note"]
    features = {"fine": _Label()}
    _fingerprint = "abc123"

    def __len__(self) -> int:
        return 9

    def __getitem__(self, index: int) -> dict:
        pixels, label = pictures()[index]
        return {"img": Image.fromarray(pixels), "fine": label, "note": "x"}


def test_records_by_column_name(reference, tmp_path, caplog):
    dst = tmp_path / "out.lmdb"
    with caplog.at_level("WARNING", logger="packer"):
        packer.convert(Records(), dst, image=ImageOptions(size=16), workers=1, source=SourceOptions(image_column="img", label_column="fine"))
    samples, meta = lmdb_samples(dst)
    assert samples == reference[0] and meta["classes"] == ["zero", "one", "two"]
    # the field not stored is named, with the fields that are (it was dropped without a word: a walkthrough)
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records if "not stored" in r.getMessage()] == [
        "the records' 'note' is not stored (packer keeps the image from 'img' and the label from 'fine'; --image-column and "
        "--label-column choose others)"]
    with pytest.raises(OptionError, match="image_column: the dataset has no image, img"):
        image_job(_NoImage(), ImageOptions(), SourceOptions())
    with pytest.raises(OptionError, match="--labels: does not apply to a Python dataset"):
        packer.convert(Records(), tmp_path / "y.lmdb", source=SourceOptions(labels="a.csv"))


class _NoImage(Records):
    column_names = ["pic", "fine"]


def test_resume_fingerprint_covers_the_dataset(tmp_path):
    def fingerprint(dataset) -> dict:
        return image_job(dataset, ImageOptions(size=16)).fingerprint("lmdb", tmp_path / "o.lmdb", {}, "skip")

    assert fingerprint(ArrayDataset("hwc")) == fingerprint(ArrayDataset("hwc"))
    changed = ArrayDataset("hwc")
    changed.items[3] = (changed.items[3][0] // 2, changed.items[3][1])
    assert fingerprint(changed) != fingerprint(ArrayDataset("hwc"))
    assert fingerprint(Unpicklable()) == fingerprint(Unpicklable())


def test_hugging_face_dataset(reference, tmp_path):
    datasets = pytest.importorskip("datasets")
    items = pictures()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})
    dataset = datasets.Dataset.from_dict({"image": [Image.fromarray(p) for p, _ in items], "label": [l for _, l in items]}, features=features)
    dst = tmp_path / "hf.lmdb"
    packer.convert(dataset, dst, image=ImageOptions(size=16), workers=2)
    samples, meta = lmdb_samples(dst)
    assert samples == reference[0] and meta["classes"] == CLASSES
    # a DatasetDict said "image_column: the dataset has no image... column (it has: train); name it" (an HF walkthrough)
    from packer.errors import SourceError

    with pytest.raises(SourceError, match=r"^a DatasetDict of the splits train, test: convert one split, dataset\['train'\]$"):
        packer.convert(datasets.DatasetDict(train=dataset, test=dataset), tmp_path / "dd.lmdb", image=ImageOptions(size=16), workers=1)
    assert not (tmp_path / "dd.lmdb").exists()


NO_MAIN_GUARD = '''
import numpy as np, packer

class Digits:  # defined in the script: the workers import the script to unpickle it
    classes = ["a", "b"]
    def __len__(self): return 20
    def __getitem__(self, i): return np.full((8, 8, 3), i, np.uint8), i % 2

packer.convert(Digits(), {dst!r}, workers=2)  # no `if __name__ == "__main__":`
print("converted")
'''


def test_a_script_without_a_main_guard_gets_one_clear_error(tmp_path):
    """Each worker imports the script to find ``Digits`` and, unguarded, ran its conversion again:
    every sample was then skipped as 'crashed the decoder' and the run ended 'none of the 20
    images could be converted'. Now the worker says what to do and the driver stops at once."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(NO_MAIN_GUARD.format(dst=str(tmp_path / "d.blob")))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0 and "converted" not in done.stdout
    assert 'put the script\'s code under `if __name__ == "__main__":`' in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("a worker process exited with status 1 before it converted anything "
                                                         "(its error is printed above)")
    assert not [line for line in done.stderr.splitlines() if "skipped dataset[" in line or "crashed the decoder (" in line]
    assert not (tmp_path / "d.blob").exists() and not (tmp_path / "d.blob.partial").exists()


def test_options_of_the_wrong_type_are_a_clear_error(tmp_path):
    with pytest.raises(TypeError, match=r"convert: image= takes a packer.ImageOptions, got dict \(for example image=packer.ImageOptions"):
        packer.convert([(np.zeros((8, 8, 3), np.uint8), 0)], tmp_path / "x.blob", image={"size": 32})


def test_arguments_of_the_wrong_type_are_a_clear_error_and_touch_nothing(tmp_path, image_folder):
    """A string is true: overwrite="no" replaced a finished dataset, resume="no" resumed; a None or
    a number for SRC was a raw TypeError from os.path."""
    dst = tmp_path / "kept.blob"
    packer.convert(image_folder, dst, image=packer.ImageOptions(size=8), workers=1)
    before = dst.read_bytes()
    for name, shown in (("overwrite", "--overwrite"), ("resume", "--resume"), ("progress", "progress")):
        with pytest.raises(OptionError, match=rf"^{shown}: must be True or False, got 'no'$"):
            packer.convert(image_folder, dst, image=packer.ImageOptions(size=8), **{name: "no"})
    assert dst.read_bytes() == before
    for src, dst_arg, message in ((None, "a.blob", "src must be a folder, file or URL path, or a map-style dataset"),
                                  (123, "a.blob", "src must be .*, got int"), (image_folder, None, "dst must be a path or URL, got NoneType")):
        with pytest.raises(TypeError, match=rf"^convert: {message}"):
            packer.convert(src, dst_arg)


IN_THE_SCRIPT = '''
import sys
import numpy as np, packer

class Digits:  # defined in the script: the workers import the script to unpickle it
    classes = ["a", "b"]
    def __len__(self): return 40
    def __getitem__(self, i): return np.full((8, 8, 3), i, np.uint8), i % 2

if __name__ == "__main__":
    print(packer.convert(Digits(), sys.argv[1], workers=2).written)
'''


@pytest.mark.parametrize("name", ["digits.lmdb", "digits/shard-%06d.tar", "digits.blob"])
def test_a_dataset_class_defined_in_the_script_converts_to_every_kind_of_writer(tmp_path, name):
    """The workers must import the script to unpickle the dataset: the task wrapping it says so,
    and so must a WebDataset piece and a placed sample wrapping that task (the piece dropped it,
    and every worker failed: "Can't get attribute 'Digits' on <module '__main__'>")."""
    import subprocess
    import sys

    script = tmp_path / "convert_digits.py"
    script.write_text(IN_THE_SCRIPT)
    dst = tmp_path / name
    done = subprocess.run([sys.executable, str(script), str(dst)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["40"]
    from readers import open_dataset

    assert [int(label) for _, label in open_dataset(tmp_path / name.split("/")[0])] == [i % 2 for i in range(40)]


UNDER_THE_GUARD = '''
import sys
import numpy as np
import packer

if __name__ == "__main__":
    class Digits:
        def __len__(self): return 30
        def __getitem__(self, i): return np.full((8, 8, 3), i, np.uint8), i % 3

    print(packer.convert(Digits(), sys.argv[-1], workers=2).written)
'''


def test_a_dataset_class_the_workers_cannot_import_is_read_in_this_process(tmp_path):
    """Defined under the script's main guard, or in a script read from stdin, the class is not
    there when a worker imports the script: every worker failed on its first item with a
    traceback ("Can't get attribute 'Digits' on <module '__mp_main__'>", an FFCV user's walkthrough)."""
    import subprocess
    import sys

    from readers import open_dataset

    script = tmp_path / "guarded.py"
    script.write_text(UNDER_THE_GUARD)
    for command, stdin, dst in (([sys.executable, str(script), "a.blob"], None, "a.blob"), ([sys.executable, "-", "b.blob"], UNDER_THE_GUARD, "b.blob")):
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 0 and done.stdout.split() == ["30"], done.stderr
        assert [int(label) for _, label in open_dataset(tmp_path / dst)] == [i % 3 for i in range(30)]
        said = "the dataset needs Digits, which the workers cannot import from the script" in done.stderr
        assert said == (stdin is None), done.stderr  # (stdin: an interactive session's, said at info level)


def test_a_label_over_the_largest_class_index_is_skipped(tmp_path):
    """LMDB's sample header holds an int32 label: 2**31 broke it in a struct.error traceback."""
    images = torch.zeros((3, 3, 8, 8), dtype=torch.uint8)
    dataset = torch.utils.data.TensorDataset(images, torch.tensor([0, 2**31, 2**31 - 1]))
    report = packer.convert(dataset, tmp_path / "out.lmdb", image=ImageOptions(size=8), workers=1)
    assert [(s.path, s.reason) for s in report.skipped] == [("dataset[1]", "unknown label 2147483648 (not a class index from 0 to 2,147,483,647)")]
    assert report.written == 2


class _Listed:
    """``dataset[i]`` is ``samples[i]`` (module level: it pickles to the workers)."""

    def __init__(self, samples, classes=None) -> None:
        self.samples = samples
        if classes is not None:
            self.classes = classes

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def test_a_16_bit_image_converts_as_its_png_file_does(tmp_path):
    """convert('RGB') clipped an I;16 image to 0 and 255; a PNG of it was scaled (a walkthrough)."""
    picture = Image.fromarray(np.arange(120, dtype=np.uint16).reshape(12, 10) * 500)
    folder = tmp_path / "files" / "a"
    folder.mkdir(parents=True)
    picture.save(folder / "x.png")
    from readers import open_dataset

    for name, source in [("from.blob", _Listed([(picture, 0)])), ("files.blob", tmp_path / "files")]:
        packer.convert(source, tmp_path / name, image=ImageOptions(grayscale=True), workers=1)
    mine, theirs = open_dataset(tmp_path / "from.blob")[0][0], open_dataset(tmp_path / "files.blob")[0][0]
    assert torch.equal(mine, theirs) and len(torch.unique(mine)) == 120


def test_minus_one_is_an_unlabeled_sample_and_a_label_after_none_is_not_dropped(tmp_path):
    """-1 (STL10's unlabeled split, a Hugging Face ClassLabel's missing label) was 'unknown label
    -1'; labels after a first sample without one were stored as -1 without a word; a numpy 0-d
    label was refused where torch's was taken (a walkthrough)."""
    from readers import open_dataset

    image = np.zeros((4, 4, 3), np.uint8)
    report = packer.convert(_Listed([(image, -1)] * 3, classes=["a", "b"]), tmp_path / "u.blob", workers=1)
    assert report.written == 3 and [open_dataset(tmp_path / "u.blob")[i][1] for i in range(3)] == [-1, -1, -1]
    report = packer.convert(_Listed([(image, 1), (image, -1), (image, np.array(0)), (image, np.array([1]))]), tmp_path / "m.blob",
                            workers=1)
    assert report.skipped == [] and [open_dataset(tmp_path / "m.blob")[i][1] for i in range(4)] == [1, -1, 0, 1]
    from packer.verify import verify  # a fault per -1 there, where README says -1 is one sample unlabeled (a walkthrough)

    assert verify(tmp_path / "u.blob").ok and verify(tmp_path / "m.blob").ok
    report = packer.convert(_Listed([(image, None), (image, 1), (image, None)]), tmp_path / "n.blob", workers=1)
    assert [(s.path, s.reason) for s in report.skipped] == [
        ("dataset[1]", "label 1, but dataset[0] has none, so the dataset converts unlabeled (give dataset[0] its label)")]


NO_GUARD = """
import numpy as np, packer

class Tiny:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return np.zeros((4, 4, 3), np.uint8), 0

packer.convert(Tiny(), {dst!r}, workers=2)
"""


def test_a_script_without_a_main_guard_is_told_in_one_line_per_worker(tmp_path):
    """The worker printed a traceback around the advice, then the parent its own (a walkthrough):
    the worker now says the advice alone."""
    import subprocess
    import sys

    script = tmp_path / "noguard.py"
    script.write_text(NO_GUARD.format(dst=str(tmp_path / "out.blob")))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**__import__("os").environ, "PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parents[1])})
    assert done.returncode != 0
    advice = [line for line in done.stderr.splitlines() if "put the script's code under" in line]
    assert advice and all(line.startswith("packer.convert was called while a worker process") for line in advice), done.stderr
    assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr  # the script's own, from the parent


def test_text_options_for_a_dataset_name_it_and_say_what_to_drop(tmp_path):
    """It named the object's repr, called it an image folder and advised --kind text, which a
    Python dataset refuses (a walkthrough)."""
    with pytest.raises(OptionError) as raised:
        packer.convert(_Listed([(np.zeros((4, 4, 3), np.uint8), 0)]), tmp_path / "t.blob", text=packer.TextOptions(), workers=1)
    assert str(raised.value) == ("python:test_pydataset._Listed: text options (text=TextOptions()) do not apply: a Python dataset "
                                 "converts as images; drop text=")


class _Named:
    """Samples whose labels come as names, whole floats, a bool, a fraction."""

    classes = ["cat", "dog", "eel"]
    labels = ["dog", 2.0, np.float32(1.0), torch.tensor(0.0), "eel", True, 0.5, "fox", 7.0]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return np.full((4, 4, 3), i, np.uint8), self.labels[i]


def test_labels_given_as_class_names_or_whole_floats_are_class_indices(tmp_path):
    """'cat' of dataset.classes was 'unknown label' and 1.0 'unknown label 1.0', where a label
    file takes both; a bool passed as a label says so (a Streaming/LitData user's walkthrough)."""
    from readers import open_dataset

    report = packer.convert(_Named(), tmp_path / "n.blob", workers=1)
    assert [(s.path, s.reason) for s in report.skipped] == [
        ("dataset[5]", "label True is a bool, not a class index"),
        ("dataset[6]", "label 0.5 is not a whole number (give an integer class index)"),
        ("dataset[7]", "label 'fox' is not one of dataset.classes"),
        ("dataset[8]", "unknown label 7 (not a class index of its 3 classes)")]
    read = open_dataset(tmp_path / "n.blob")
    assert [int(label) for _, label in read] == [1, 2, 1, 0, 2] and read.classes == ["cat", "dog", "eel"]
    unnamed = [(np.zeros((4, 4, 3), np.uint8), "dog")] * 2
    with pytest.raises(packer.PackerError, match=r"\(first: dataset\[0\]: label 'dog' is a name, and the dataset has no classes list"):
        packer.convert(unnamed, tmp_path / "u.blob", workers=1)


class _Unidentified:
    """Sample 1 raises as a Hugging Face Image() column raises on bytes PIL cannot identify."""

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i):
        if i == 1:
            import io

            from PIL import Image
            Image.open(io.BytesIO(b"not an image"))
        return np.zeros((4, 4, 3), np.uint8), 0


def test_a_reading_error_names_no_memory_address(tmp_path):
    """PIL's 'cannot identify image file <_io.BytesIO object at 0x7f...>' went into the metadata,
    so two runs' metadata and blob bytes differed (an HF walkthrough; README: identical whatever
    the worker count, apart from created)."""
    reports = [packer.convert(_Unidentified(), tmp_path / f"o{n}.blob", workers=n) for n in (1, 2)]
    assert [[(s.path, s.reason) for s in r.skipped] for r in reports] == [
        [("dataset[1]", "reading it raised UnidentifiedImageError: cannot identify image file")]] * 2


def test_a_refused_resume_says_the_dataset_changed_not_its_digests(tmp_path):
    """A Hugging Face dataset changed since the interrupted run: the refusal said "dataset was
    datasets:abc123 in the interrupted run, now datasets:..." (an HF walkthrough)."""
    from packer.writers.fingerprint import fingerprint_difference

    def fingerprint(dataset) -> dict:
        return image_job(dataset, ImageOptions(size=16), SourceOptions(image_column="img", label_column="fine")).fingerprint(
            "lmdb", tmp_path / "o.lmdb", {}, "skip")

    mapped = Records()
    mapped._fingerprint = "9f86d081884c7d65"
    assert fingerprint_difference(fingerprint(Records()), fingerprint(mapped)) == (
        "the dataset is not the one the interrupted run converted: its Hugging Face fingerprint was abc123, now "
        "9f86d081884c (a .map, .filter, .select or .shuffle makes another dataset)")
    changed = ArrayDataset("hwc")
    changed.items[3] = (changed.items[3][0] // 2, changed.items[3][1])
    said = fingerprint_difference(image_job(ArrayDataset("hwc"), ImageOptions(size=16)).fingerprint("lmdb", tmp_path / "o.lmdb", {}, "skip"),
                                  image_job(changed, ImageOptions(size=16)).fingerprint("lmdb", tmp_path / "o.lmdb", {}, "skip"))
    assert said == "the dataset is not the one the interrupted run converted: its samples or their order changed"
