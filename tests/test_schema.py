import json

import pytest

from readers.schema import (
    FORMAT_VERSION,
    Metadata,
    PackedFormatError,
    Skipped,
    UnsupportedVersionError,
)


def make_meta(**overrides) -> Metadata:
    fields = dict(
        format="lmdb",
        count=3,
        channels=3,
        shape=(3, 32, 32),
        classes=("cat", "dog"),
        preprocessing={"size": [32, 32]},
        skipped=(Skipped("a/b.jpg", "truncated"),),
        tool_version="0.1.0",
        created="2026-01-01T00:00:00+00:00",
    )
    fields.update(overrides)
    return Metadata(**fields)


def test_json_round_trip_is_exact():
    meta = make_meta()
    assert Metadata.from_json(meta.to_json()) == meta


def test_json_is_plain_and_versioned():
    data = json.loads(make_meta().to_json())
    assert data["format_version"] == FORMAT_VERSION
    assert data["tool"] == "packer"
    assert data["shape"] == [3, 32, 32]
    assert data["skipped"] == [{"path": "a/b.jpg", "reason": "truncated"}]


def test_undecodable_file_names_survive_json():
    name = b"caf\xe9.jpg".decode("utf-8", "surrogateescape")  # a Latin-1 name on a UTF-8 system
    meta = make_meta(skipped=(Skipped(name, "bad"),))
    text = meta.to_json()
    text.encode("ascii")  # escaped, so the record is valid UTF-8
    assert Metadata.from_json(text).skipped[0].path == name


def test_newer_version_is_refused_naming_both_versions():
    data = json.loads(make_meta().to_json())
    data["format_version"] = FORMAT_VERSION + 1
    with pytest.raises(UnsupportedVersionError, match=rf"version {FORMAT_VERSION + 1}.*up to version {FORMAT_VERSION}"):
        Metadata.from_dict(data, where="x.lmdb")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("tool"), "not a packer dataset"),
        (lambda d: d.update(format_version="1"), "format_version"),
        (lambda d: d.update(count=-1), "count"),
        (lambda d: d.update(shape=[3, 0, 4]), "shape"),
        (lambda d: d.update(shape=[1, 4, 4]), "disagrees"),
        (lambda d: d.update(encoding="webp"), "encoding"),
        (lambda d: d.update(format="zip"), "format"),
        (lambda d: d.pop("count"), "count"),
    ],
)
def test_invalid_records_are_refused(mutate, message):
    data = json.loads(make_meta().to_json())
    mutate(data)
    with pytest.raises(PackedFormatError, match=message):
        Metadata.from_dict(data, where="x.lmdb")


def test_a_record_missing_fields_names_them_not_pythons_internals():
    """{"tool": "packer", "format_version": 1} said "Metadata.__init__() missing 3 required
    positional arguments" (a walkthrough): the fields are named."""
    with pytest.raises(PackedFormatError, match=r"^x.h5: invalid metadata: no format, count, channels, shape$"):
        Metadata.from_dict({"tool": "packer", "format_version": 1}, where="x.h5")


def test_not_json_is_refused():
    with pytest.raises(PackedFormatError, match="not valid JSON"):
        Metadata.from_json(b"\x80\x81 garbage", where="x.lmdb")
    with pytest.raises(PackedFormatError, match="not a JSON object"):
        Metadata.from_json("[1, 2]", where="x.lmdb")


def test_fixed_shape_and_sample_bytes():
    assert make_meta().sample_nbytes == 3 * 32 * 32
    variable = make_meta(shape=None)
    assert not variable.fixed_shape and variable.sample_nbytes is None
