"""What C decoders print never reaches the terminal raw: it is captured in the worker, attached to
the input's skip reason or logged as one packer warning, and ``--quiet`` silences it all.

The odd files are made here: a JPEG with bytes before its end marker (libjpeg-turbo, through
OpenCV, prints "Corrupt JPEG data: 3 extraneous bytes before marker 0xda" and decodes it whole),
a JPEG with a bad restart marker in its scan (it prints "Corrupt JPEG data: premature end of data
segment" and decodes the rest grey: skipped, packer/preprocess/decode.py, ``damage_printed``) and
a Deflate TIFF with damaged strip data (libtiff prints "ZIPDecode: Decoding error ..." and Pillow
then fails).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import timeit
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imagefiles import gradient, jpeg_bytes, write
from packer.options import ImageOptions
from packer.preprocess.messages import MAX_MESSAGE_CHARS, DecoderOutput
from packer.preprocess.task import Encoded, Failed, ImageTask
from packer.sources.images import ImageItem
from readers.formats import open_store

REPO = Path(__file__).resolve().parents[1]


def _picture() -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 80, 3), dtype=np.uint8))


def corrupt_scan_jpeg() -> bytes:
    """Complete JPEG (ends with EOI, so OpenCV decodes it) with a restart marker planted mid-scan."""
    buffer = io.BytesIO()
    _picture().save(buffer, "JPEG", quality=90)
    data = bytearray(buffer.getvalue())
    middle = len(data) // 2
    data[middle] ^= 0xFF
    data[middle + 1 : middle + 3] = b"\xff\xd3"
    return bytes(data)


def extraneous_bytes_jpeg() -> bytes:
    """A whole JPEG with three bytes before its scan's marker: decoded whole, with a warning."""
    buffer = io.BytesIO()
    _picture().save(buffer, "JPEG", quality=90)
    data = buffer.getvalue()
    scan = data.index(b"\xff\xda")
    return data[:scan] + b"abc" + data[scan:]


def damaged_deflate_tiff() -> bytes:
    buffer = io.BytesIO()
    _picture().save(buffer, "TIFF", compression="tiff_adobe_deflate")
    data = bytearray(buffer.getvalue())
    for i in range(200, 2000, 7):
        data[i] ^= 0x5A
    return bytes(data)


def convert_one(path: Path) -> Encoded | Failed:
    return ImageTask(ImageOptions(size=(16, 16)))(ImageItem(str(path), 0))


def test_a_warning_of_a_converted_input_comes_back_with_it(tmp_path, capfd):
    result = convert_one(write(tmp_path / "odd.jpg", extraneous_bytes_jpeg()))
    assert isinstance(result, Encoded)
    assert "Corrupt JPEG data: 3 extraneous bytes" in result.decoder_messages
    assert capfd.readouterr().err == ""  # nothing reached this process's fd 2


def test_a_scan_the_decoder_ends_early_is_skipped(tmp_path, capfd):
    result = convert_one(write(tmp_path / "cut.jpg", corrupt_scan_jpeg()))
    assert isinstance(result, Failed) and result.reason.startswith("truncated: its JPEG data ends before the picture does")
    assert "(the decoder printed: Corrupt JPEG data: premature end of data segment" in result.reason
    assert capfd.readouterr().err == ""


def test_a_cut_jpeg_closed_or_zero_filled_is_skipped_and_a_whole_one_with_a_tail_is_not(tmp_path, capfd):
    """Three cut copies were stored without a word (a data-safety walkthrough): cut, closed with an
    end marker and followed by other bytes (Pillow's path: half grey), cut where a download had
    preallocated zeros (no end marker: the zeros decoded as a picture), and the same closed with
    its marker. A whole JPEG followed by a trailer or by zero padding converts."""
    buffer = io.BytesIO()
    _picture().save(buffer, "JPEG", quality=90)
    whole = buffer.getvalue()
    half = len(whole) // 2
    for name, data, said in [
        ("closed.jpg", whole[:half] + b"\xff\xd9" + whole[half:half + 100], "truncated: its JPEG data ends before the picture does"),
        ("zeros.jpg", whole[:half] + bytes(len(whole) - half), f"truncated: its JPEG data ends in {len(whole) - half:,} zero bytes, not its"),
        ("zeros_closed.jpg", whole[:half] + bytes(len(whole) - half) + b"\xff\xd9",
         f"truncated: {len(whole) - half:,} zero bytes stand for its JPEG data before the end-of-image marker"),
    ]:
        result = convert_one(write(tmp_path / name, data))
        assert isinstance(result, Failed) and result.reason.startswith(said), (name, result)
    thumbnail = b"Exif\0\0" + b"\xff\xd8\xff\xda\0\x02" + bytes(64) + b"\xff\xd9"  # an APP1 holding a JPEG's markers
    with_thumbnail = whole[:2] + b"\xff\xe1" + (len(thumbnail) + 2).to_bytes(2, "big") + thumbnail + whole[2:]
    result = convert_one(write(tmp_path / "thumb_cut.jpg", with_thumbnail[:half + 80] + bytes(len(whole) - half)))
    assert isinstance(result, Failed) and "zero bytes, not its end-of-image marker" in result.reason, result  # (not the thumbnail's)
    for name, data in (("trailer.jpg", whole + b"a camera's trailer" * 20), ("padded.jpg", whole + bytes(4096)),
                       ("trailer_padded.jpg", whole + b"SEFT" * 8 + bytes(32)), ("thumb.jpg", with_thumbnail + b"SEFT" + bytes(64))):
        assert isinstance(convert_one(write(tmp_path / name, data)), Encoded), name  # (the last two: a diff review)
    from packer.preprocess.fetch import gpu_decodable  # (nvJPEG would decode the zeros: the CPU path says why not)

    assert gpu_decodable(whole + bytes(4096), 10**6) and not gpu_decodable(whole[:half] + bytes(len(whole) - half) + b"\xff\xd9", 10**6)
    assert capfd.readouterr().err == ""


def test_what_a_failing_decoder_printed_is_in_the_skip_reason(tmp_path, capfd):
    result = convert_one(write(tmp_path / "odd.tif", damaged_deflate_tiff()))
    assert isinstance(result, Failed)
    assert result.reason.startswith("cannot decode (") and "(the decoder printed: ZIPDecode: " in result.reason
    assert capfd.readouterr().err == ""


def test_a_clean_input_has_no_messages_and_fd_2_is_restored(tmp_path, capfd):
    result = convert_one(write(tmp_path / "fine.jpg", jpeg_bytes(gradient(24, 32))))
    assert isinstance(result, Encoded) and result.decoder_messages == ""
    os.write(2, b"after\n")  # fd 2 points where it did before the decode
    assert capfd.readouterr().err == "after\n"


def test_captured_text_is_tidy_and_bounded(capfd):
    with DecoderOutput() as printed:
        os.write(2, b"same line\nsame line\n" + b"x" * 5000 + b"\n")
        import warnings

        warnings.warn("from Python", UserWarning)
    assert printed.text.startswith("same line; xxx") and len(printed.text) == MAX_MESSAGE_CHARS
    with DecoderOutput() as again:  # the capture file starts empty for the next input
        warnings.warn("only this", UserWarning)
    assert again.text == "UserWarning: only this"
    assert capfd.readouterr().err == ""


def test_the_capture_costs_little_beside_decoding_a_small_jpeg():
    """Bounded, not exact: capturing (nothing printed) costs under 10% of converting a 80x60 JPEG
    to 32x32 (measured here: ~10 us against ~300-450 us, 2 busy cores)."""
    data = jpeg_bytes(gradient(60, 80))
    task = ImageTask(ImageOptions(size=(32, 32)))
    item = ImageItem("x.jpg", 0)

    def capture_only() -> None:
        with DecoderOutput():
            pass

    capture = min(timeit.repeat(capture_only, number=500, repeat=5)) / 500
    convert = min(timeit.repeat(lambda: task.convert(item, data), number=100, repeat=5)) / 100
    assert capture < 0.10 * convert, (capture, convert)


def _convert_cli(src: Path, dst: Path, *extra: str) -> subprocess.CompletedProcess:
    """``python -m packer convert`` in a subprocess: fd 2 is the real one (CliRunner does not capture it)."""
    return subprocess.run(
        [sys.executable, "-m", "packer", "convert", str(src), str(dst), "--size", "16", "-j", "2", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )


@pytest.fixture(scope="module")
def odd_folder(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("odd") / "src"
    for i in range(3):
        write(src / "a" / f"corrupt_{i}.jpg", extraneous_bytes_jpeg())
        write(src / "b" / f"fine_{i}.jpg", jpeg_bytes(gradient(24, 32, seed=i)))
    write(src / "a" / "damaged.tif", damaged_deflate_tiff())
    write(src / "a" / "scan.jpg", corrupt_scan_jpeg())
    return src


def test_quiet_means_quiet_through_the_command_line(odd_folder, tmp_path):
    result = _convert_cli(odd_folder, tmp_path / "out.lmdb", "-q")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no "Corrupt JPEG data", no "ZIPDecode", nothing
    assert result.stdout.startswith("wrote 6 images")
    skipped = open_store(tmp_path / "out.lmdb").meta.skipped
    assert [s.path for s in skipped] == ["a/damaged.tif", "a/scan.jpg"] and "(the decoder printed: ZIPDecode: " in skipped[0].reason


def test_without_quiet_each_message_is_one_packer_warning(odd_folder, tmp_path):
    result = _convert_cli(odd_folder, tmp_path / "out.lmdb")
    assert result.returncode == 0, result.stderr
    lines = [line.split("\r")[-1].strip() for line in result.stderr.splitlines()]  # progress bar redraws: \r
    lines = [line for line in lines if line and "img/s]" not in line]
    assert all(line.startswith("warning: ") for line in lines), lines  # no raw decoder line
    converted = [line for line in lines if "converted, but the decoder printed: Corrupt JPEG data" in line]
    assert sorted(line.split()[1] for line in converted) == ["a/corrupt_0.jpg:", "a/corrupt_1.jpg:", "a/corrupt_2.jpg:"]
    assert sum("skipped a/damaged.tif: cannot decode" in line and "ZIPDecode" in line for line in lines) == 1
    assert sum(line.startswith("warning: skipped a/scan.jpg: truncated") for line in lines) == 1
