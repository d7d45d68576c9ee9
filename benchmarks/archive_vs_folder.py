"""Conversion speed from archives and Parquet files against the same images in a class folder.

    python -m benchmarks.archive_vs_folder                    # -> benchmarks/out/archive_vs_folder.json
    python -m benchmarks.archive_vs_folder --update-results   # -> benchmarks/results/ (the committed figures)

The same ImageNet-like JPEGs (``common.imagenet_like``: 500x375, ~100 KB, 10 classes) are
converted to LMDB at ``--size`` from: the class folder; a .tar of it (members read by offset in
the workers); an ImageNet-style tar of per-class tars; a .zip (deflated members inflated in the
workers); a .tar.gz (streamed once in this process, by zlib-ng where installed: ``gzip_inflater``
in the JSON); Parquet files as the Hugging Face Hub stores a dataset (an Image column of
``{bytes, path}``, a ClassLabel label, row groups of 100 rows, 500 rows a file; each worker reads
its rows' images a row group at a time). Every conversion is timed whole, from
``packer.convert`` call to return (listing included), with the default worker count. Sources
alternate within each round and the order rotates between rounds (ABAB...), so drift on a
shared machine falls on all of them; each archive's speed is compared with the folder's in the
same round, and the report gives the median (min-max) of those ratios over the rounds.
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

import packer
from packer.sources.tarstream import gzip_inflater, stream_tar

from .common import add_output_arguments, cpu_count, imagenet_like, machine, markdown_table, output_dir, save_json, run_main

SOURCES = ("folder", "tar", "tar of tars", "zip", "tar.gz", "parquet")
#: Rows per Parquet row group and per file, as the Hub's image datasets have them (``datasets``' default for images).
PARQUET_GROUP, PARQUET_FILE = 100, 500


def make_archives(folder: Path, where: Path) -> dict[str, Path]:
    """The folder as each kind of archive (members in sorted order, as tar and zip write them)."""
    files = sorted(p for p in folder.rglob("*.jpg"))
    made = {"folder": folder, "tar": where / "train.tar", "tar of tars": where / "imagenet.tar", "zip": where / "train.zip",
            "tar.gz": where / "train.tar.gz"}  # (and "parquet": a folder of files, below)
    with tarfile.open(made["tar"], "w") as tar:
        tar.add(folder, arcname="train")
    with tarfile.open(made["tar.gz"], "w:gz", compresslevel=6) as tar:
        tar.add(folder, arcname="train")
    with zipfile.ZipFile(made["zip"], "w", zipfile.ZIP_DEFLATED) as zf:
        for path in files:
            zf.write(path, path.relative_to(folder).as_posix())
    with tarfile.open(made["tar of tars"], "w") as outer:
        for cls in sorted(p for p in folder.iterdir() if p.is_dir()):
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as inner:
                for path in sorted(cls.iterdir()):
                    inner.add(path, arcname=path.name)
            info = tarfile.TarInfo(f"{cls.name}.tar")
            info.size = buffer.tell()
            buffer.seek(0)
            outer.addfile(info, buffer)
    made["parquet"] = write_parquet(folder, files, where / "data")
    return made


def write_parquet(folder: Path, files: list[Path], where: Path) -> Path:
    """The images as the Hub's Parquet files (``train-0000N-of-0000M.parquet``), in the folder's sample order."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    features = {"image": {"_type": "Image"}, "label": {"names": classes, "_type": "ClassLabel"}}
    metadata = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    where.mkdir()
    parts = [files[i : i + PARQUET_FILE] for i in range(0, len(files), PARQUET_FILE)]
    for k, part in enumerate(parts):
        rows = [{"image": {"bytes": p.read_bytes(), "path": p.name}, "label": classes.index(p.parent.name)} for p in part]
        table = pa.Table.from_pylist(rows).replace_schema_metadata(metadata)
        pq.write_table(table, where / f"train-{k:05d}-of-{len(parts):05d}.parquet", row_group_size=PARQUET_GROUP)
    return where


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000, help="images (10 classes)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=64)
    add_output_arguments(parser)
    args = parser.parse_args()
    folder = imagenet_like(args.images)
    seconds: dict[str, list[float]] = {name: [] for name in SOURCES}
    with tempfile.TemporaryDirectory(prefix="packer-archive-bench-") as tmp:
        made = make_archives(folder, Path(tmp))
        sizes = {name: (path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.glob("*.parquet")) or None)
                 for name, path in made.items()}
        count = None
        listing: list[float] = []
        for round_ in range(args.rounds + 1):  # round 0 warms the page cache and the fork server: not kept
            order = SOURCES[round_ % len(SOURCES):] + SOURCES[: round_ % len(SOURCES)]
            for name in order:
                dst = Path(tmp) / "out.lmdb"
                start = time.perf_counter()
                report = packer.convert(made[name], dst, image=packer.ImageOptions(size=args.size), overwrite=True)
                took = time.perf_counter() - start
                assert count in (None, report.written), (name, report.written)
                count = report.written
                if round_:
                    seconds[name].append(took)
                print(f"round {round_} {name:12s} {report.written / took:7.1f} img/s", flush=True)
                shutil.rmtree(dst, ignore_errors=True)
            start = time.perf_counter()  # the .tar.gz's one streaming pass alone (inflate + headers), this process
            stream_tar(str(made["tar.gz"]), lambda member: member.endswith(".jpg"), lambda held: None)
            if round_:
                listing.append(time.perf_counter() - start)
    assert count is not None
    results = {}
    for name in SOURCES:
        rates = [count / s for s in seconds[name]]
        ratios = [f / s for f, s in zip(seconds["folder"], seconds[name])]  # archive speed / folder speed, same round
        results[name] = {
            "seconds": seconds[name], "images_per_s": {"median": statistics.median(rates), "min": min(rates), "max": max(rates)},
            "vs_folder": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}, "bytes": sizes[name],
        }
    payload = {
        "benchmark": "archive_vs_folder", "command": " ".join(["python -m benchmarks.archive_vs_folder", *sys.argv[1:]]),
        "images": count, "source": str(folder.relative_to(Path(__file__).resolve().parent.parent)), "size": args.size,
        "encoding": "raw", "format": "lmdb", "workers": cpu_count(), "rounds": args.rounds, "machine": machine(), "results": results,
        "note": "rates are whole conversions (listing included); vs_folder: folder seconds / archive seconds in the same round; "
                "tar.gz_pass: the .tar.gz's streaming pass alone (inflate + tar headers, image bytes kept) in this process, "
                "the part of its conversion no worker can start before (the listing fixes order and labels)",
        "gzip_inflater": gzip_inflater().__name__,
        "tar.gz_pass": {
            "seconds": listing, "uncompressed_mb_per_s": _spread([sizes["tar"] / s / 1e6 for s in listing]),
            "share_of_folder_conversion": _spread([s / f for s, f in zip(listing, seconds["folder"])]),
        },
    }
    path = save_json("archive_vs_folder", payload, output_dir(args.update_results, args.out))
    print(markdown_table(
        ["source", "img/s median (min-max)", "vs folder, median (min-max)"],
        [[name, f"{r['images_per_s']['median']:.0f} ({r['images_per_s']['min']:.0f}-{r['images_per_s']['max']:.0f})",
          f"{r['vs_folder']['median']:.2f}x ({r['vs_folder']['min']:.2f}-{r['vs_folder']['max']:.2f})"] for name, r in results.items()],
    ))
    print(f"wrote {path}")


if __name__ == "__main__":
    run_main(main)
