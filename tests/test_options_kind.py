"""Options of one kind of source (image or text) typed for the other are refused in one line,
whatever their value, the default too (never silently dropped); invalid text option values
exit with 2, as invalid image option values do (README, *Bad input*)."""

import pytest
from click.testing import CliRunner

from corpora import write_texts
from imagefiles import gradient, jpeg_bytes, write
from packer.cli import IMAGE_OPTIONS, TEXT_OPTIONS, cli, convert as convert_command
from packer.errors import OptionError
from packer.options import DEFAULT_MAX_PIXELS, TextOptions

# Each kind's options, typed at their default (or, with no default, a value valid on its own).
IMAGE_TYPED = {
    "size": ["--size", "8"], "resize": ["--resize", "8"], "resize_mode": ["--resize-mode", "none"], "grayscale": ["--grayscale"],
    "encoding": ["--encoding", "raw"], "quality": ["--quality", "90"], "max_pixels": ["--max-pixels", str(DEFAULT_MAX_PIXELS)],
    "decode_device": ["--decode-device", "cpu"],
}
TEXT_TYPED = {"tokenizer": ["--tokenizer", "bytes"], "lines": ["--lines"], "text_field": ["--text-field", "text"],
              "eos": ["--eos", "256"], "max_tokens": ["--max-tokens", "5"], "bos": ["--bos", "auto"]}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("kinds")
    for i in range(2):
        write(root / "images" / "cat" / f"{i}.jpg", jpeg_bytes(gradient(8, 8, seed=i)))
    (root / "corpus").mkdir()
    write_texts(root / "corpus", {"a.txt": "one document\n", "b.txt": "another\n"})
    return root / "images", root / "corpus"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_error(result, code=2):
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.output, result.output
    return lines[0]


def test_every_option_of_one_kind_is_listed():
    """A new image or text option of convert joins its list (or it would go unchecked)."""
    text = {p.name for p in convert_command.params if (p.help or "").startswith("Text:")}
    assert set(TEXT_OPTIONS) == text == set(TEXT_TYPED)
    assert set(IMAGE_OPTIONS) == set(IMAGE_TYPED)


@pytest.mark.parametrize("name", IMAGE_OPTIONS)
def test_an_image_option_typed_for_a_text_corpus_is_refused_at_any_value(tmp_path, sources, name):
    _, corpus = sources
    line = one_line_error(run("convert", corpus, tmp_path / "t.blob", *IMAGE_TYPED[name], "-q"))
    assert line == (f"Error: --{name.replace('_', '-')}: applies to images only, and {corpus} holds no images, only text files, "
                    "so it is read as a text corpus; drop it, or give a folder of images")
    assert not (tmp_path / "t.blob").exists()


@pytest.mark.parametrize("name", TEXT_OPTIONS)
def test_a_text_option_typed_for_an_image_folder_is_refused_at_any_value(tmp_path, sources, name):
    images, _ = sources
    line = one_line_error(run("convert", images, tmp_path / "i.lmdb", *TEXT_TYPED[name], "-q"))
    option = f"--{name.replace('_', '-')}"
    assert line == f"Error: {images}: text options ({option}) do not apply to an image folder; drop them, or pass --kind text"
    assert not (tmp_path / "i.lmdb").exists()


def test_the_same_options_are_used_for_their_own_kind(tmp_path, sources):
    images, corpus = sources
    done = run("convert", images, tmp_path / "i.lmdb", "--encoding", "raw", "--resize-mode", "none", "--decode-device", "cpu", "-j", "1", "-q")
    assert done.exit_code == 0, done.output
    done = run("convert", corpus, tmp_path / "t.blob", "--tokenizer", "bytes", "--lines", "-j", "1", "-q")  # (--text-field: below)
    assert done.exit_code == 0, done.output


@pytest.mark.parametrize("args, message", [
    (["--eos", "-1"], "--eos: must be a token id >= 0 or 'none', got -1"),
    (["--eos", "abc"], "--eos: must be a token id >= 0 or 'none', got 'abc'"),
    (["--eos", "²"], "--eos: must be a token id >= 0 or 'none', got '²'"),
    (["--eos", "99999"], "--eos: id 99999 is outside the tokenizer's vocabulary of 257"),
    (["--text-field", ""], "--text-field: must be a non-empty field name, got ''"),
    (["--tokenizer", ""], "--tokenizer: must be 'bytes' or a tokenizer file, got ''"),
])
def test_invalid_text_option_values_exit_2(tmp_path, sources, args, message):
    _, corpus = sources
    assert one_line_error(run("convert", corpus, tmp_path / "t.blob", *args, "-q")) == f"Error: {message}"


def test_click_range_errors_exit_2_too(tmp_path, sources):
    _, corpus = sources
    result = run("convert", corpus, tmp_path / "t.blob", "--max-tokens", "0", "-q")
    assert result.exit_code == 2 and result.stderr.strip().splitlines()[-1].startswith("Error: Invalid value for '--max-tokens'")


@pytest.mark.parametrize("fields, option", [
    ({"eos": True}, "--eos"), ({"max_tokens": True}, "--max-tokens"), ({"text_field": 5}, "--text-field"),
    ({"bos": "first"}, "--bos"), ({"bos": -1}, "--bos"),
    ({"tokenizer": None}, "--tokenizer"), ({"tokenizer": ""}, "--tokenizer"),
])
def test_text_options_from_python_refuse_what_the_cli_refuses(fields, option):
    with pytest.raises(OptionError, match=f"^{option}: must be"):
        TextOptions(**fields)


def test_numpy_integers_are_token_ids_and_counts(sources, tmp_path):
    """np.int64(5) was refused as 'not a token id' (a walkthrough); taken, it is stored as an int."""
    import numpy as np

    options = TextOptions(eos=np.int64(5), max_tokens=np.int32(3))
    assert (options.eos, options.max_tokens) == (5, 3) and type(options.eos) is int and type(options.max_tokens) is int
    _, corpus = sources
    from packer import convert
    from readers import open_dataset

    convert(corpus, tmp_path / "t.blob", text=TextOptions(max_tokens=np.int64(3)), workers=1)

    assert open_dataset(tmp_path / "t.blob").meta.preprocessing["max_tokens"] == 3


def test_python_options_of_the_other_kind_are_refused_at_their_defaults(sources, tmp_path):
    """From Python as from the command line: ``image=ImageOptions()`` on a corpus and
    ``text=TextOptions()`` on an image folder are given, so refused (they were dropped and
    named '--kind text')."""
    from packer import ImageOptions, convert

    images, corpus = sources
    with pytest.raises(OptionError, match=r"^image=ImageOptions\(\): applies to images only, and .* holds no images, only text files, so it is read as a text corpus"):
        convert(corpus, tmp_path / "t.blob", image=ImageOptions(), workers=1)
    with pytest.raises(OptionError, match=r"text options \(text=TextOptions\(\)\) do not apply to an image folder"):
        convert(images, tmp_path / "i.blob", text=TextOptions(), workers=1)
    assert not list(tmp_path.iterdir())


def test_text_field_typed_as_its_default_on_a_corpus_without_records_is_refused(sources, tmp_path):
    """README: refused whatever its value; --text-field text (the default) was taken without a
    word where --text-field body was refused (an options walkthrough)."""
    _, corpus = sources
    for value in ("text", "body"):
        result = run("convert", corpus, tmp_path / f"{value}.blob", "--text-field", value, "-q")
        assert result.exit_code == 2 and result.stderr.strip() == (
            f"Error: --text-field: applies to JSON Lines and Parquet files, and {corpus} has none; drop it"), result.output
    assert run("convert", corpus, tmp_path / "plain.blob", "-q").exit_code == 0
    from packer.sources.text import refuse_text_field_without_records
    import logging

    records = tmp_path / "records"
    records.mkdir()
    (records / "x.jsonl").write_text('{"text": "a"}\n')
    (records / "latest.jsonl").symlink_to("x.jsonl")
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logging.getLogger("packer").addHandler(handler)
    try:
        refuse_text_field_without_records(records)  # (the command's check: the scan says the warnings, once)
    finally:
        logging.getLogger("packer").removeHandler(handler)
    assert seen == []


@pytest.mark.parametrize("command, args, names", [
    ("convert", ["--size", "8", "--size", "16"], "--size/-s"),
    ("convert", ["-f", "blob", "--format", "lmdb"], "--format/-f"),
    ("convert", ["--on-error=fail", "--on-error", "skip"], "--on-error"),
    ("convert", ["--resume", "--resume"], "--resume"),
    ("doctor", ["--batch-size", "4", "--batch-size", "8"], "--batch-size"),
])
def test_an_option_given_twice_is_refused(tmp_path, sources, command, args, names):
    """click kept the last value of a one-value option typed twice and dropped the first without
    a word (`--size 224 ... --size 128` converted at 128): refused, naming it, before any work."""
    images, _ = sources
    dst = [tmp_path / "i.blob"] if command == "convert" else []
    line = one_line_error(run(command, images, *dst, *args, "-q" if command == "convert" else "--batches=1"))
    assert line == f"Error: {names} given more than once; give it once (its values would not all be used)"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, said", [
    (["--max-res", "256"], "--max-res: no such option; packer has no max_resolution (FFCV's, which shrinks larger images): "),
    (["--compress-probability=0.5"], "--compress-probability: no such option; packer has no compress_probability (FFCV's)"),
    (["--num-workers", "4"], "--num-workers: no such option; use --workers (-j)"),
    (["--chunk-bytes", "64MB"], "--chunk-bytes: no such option; use --shard-bytes (WebDataset output; LitData's chunk_bytes)"),
])
def test_a_peer_tools_option_says_packers_way(tmp_path, sources, args, said):
    """click offered its nearest name: --max-res got '--max-pixels', which skips larger images
    where FFCV's max_resolution shrinks them (an FFCV user's walkthrough: 93% of a dataset skipped, exit 0)."""
    images, _ = sources
    line = one_line_error(run("convert", images, tmp_path / "i.blob", *args))
    assert line.startswith(f"Error: {said}"), line
    assert not list(tmp_path.iterdir())


def test_repeatable_options_and_help_are_not_refused(tmp_path, sources):
    images, _ = sources
    context = cli.commands["bench"].make_context("bench", [str(images), "-f", "blob", "-f", "lmdb"])  # (parsed, not run)
    assert context.params["formats"] == ("blob", "lmdb")
    assert run("convert", images, tmp_path / "i.blob", "--size", "8", "--size", "9", "--help").exit_code == 0
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("files", [{}, {"notes.md": "not a document\n"}, {"sub/notes.md": "x\n"}])
@pytest.mark.parametrize("name", ["tokenizer", "lines", "eos"])
def test_text_options_for_a_folder_of_neither_images_nor_text_say_it_holds_no_text(tmp_path, files, name):
    """A folder holding no images and no text files (empty, notes only) given text options is a
    corpus without documents: it was called 'an image folder' ('drop them, or pass --kind
    text'), and dropping them said 'must be a folder of images' (a text walkthrough)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    line = one_line_error(run("convert", folder, tmp_path / "t.blob", *TEXT_TYPED[name], "-q"), code=1)
    assert line == f"Error: {folder}: no .txt, .jsonl, .ndjson or .parquet files found"
    with pytest.raises(Exception, match=r"no \.txt, \.jsonl, \.ndjson or \.parquet files found"):
        __import__("packer").convert(folder, tmp_path / "p.blob", text=TextOptions())
    assert not (tmp_path / "t.blob").exists() and not (tmp_path / "p.blob").exists()


def test_text_options_for_a_folder_holding_an_unread_image_or_an_archive_still_say_image_folder(tmp_path):
    """Only a folder of neither is read as a corpus: one holding a .heic or a .tar is an image source."""
    for extra in ("x.heic", "shards.tar"):
        folder = tmp_path / extra.split(".")[1]
        folder.mkdir()
        (folder / extra).write_bytes(b"\0" * 16)
        line = one_line_error(run("convert", folder, tmp_path / "t.blob", "--lines", "-q"))
        assert line == f"Error: {folder}: text options (--lines) do not apply to an image folder; drop them, or pass --kind text"
