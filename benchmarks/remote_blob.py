"""A blob to s3:// streamed by multipart upload vs staged whole, vs a local blob, in one run.

    python -m benchmarks.remote_blob                  # 1,000 ImageNet-like JPEGs, raw 224, 3 repeats
    python -m benchmarks.remote_blob --images 400 --repeats 1

Needs ``pip install 'packer[remote]' 'moto[server]'``. The S3 server is moto's, started as a
separate process on 127.0.0.1 (off the converting process's CPU time, but on the same cores):
its speed is not S3's, so compare the three rows with each other, not with a real bucket.
For each: conversion images/s, median (min-max) of ``--repeats`` after a warm-up, and the
peak local disk the conversion's file occupied (allocated blocks, sampled every 5 ms):
(a) a local blob: the file whole, as reference;
(b) ``s3://`` streamed (packer/multipart.py): parts sent while converting, local blocks released;
(c) ``s3://`` staged whole, then uploaded (the path every other URL scheme takes).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from packer import ImageOptions, convert

from .common import Rate, add_output_arguments, cpu_count, imagenet_like, machine, markdown_table, measure, output_dir, save_json, run_main


class PeakDisk:
    """The most disk blocks any ``*.partial`` file under ``folders`` held, sampled in a thread."""

    def __init__(self, *folders: Path) -> None:
        self.folders, self.peak, self._stop = folders, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for folder in self.folders:
                for path in folder.glob("*.partial"):
                    try:
                        self.peak = max(self.peak, os.stat(path).st_blocks * 512)
                    except FileNotFoundError:
                        pass
            time.sleep(0.005)

    def __enter__(self) -> "PeakDisk":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def moto_server() -> tuple[subprocess.Popen, str]:
    """moto's S3 server in its own process on a free loopback port, and its endpoint."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, endpoint
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("moto's server did not start (pip install 'moto[server]')")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    add_output_arguments(parser)
    args = parser.parse_args()
    src = imagenet_like(args.images)
    proc, endpoint = moto_server()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_ENDPOINT_URL=endpoint, AWS_DEFAULT_REGION="us-east-1")
    import s3fs

    import packer.remote as remote
    from packer.writers.blob import BlobWriter

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
    fs.mkdir("bench")
    image = ImageOptions(size=224)
    results: dict[str, tuple[Rate, int]] = {}
    real = BlobWriter.remote  # how a blob DST at a URL is written (packer/writers/blob.py, RemoteBlob)

    class StagedWhole(real):  # type: ignore[misc, valid-type]
        """(c): no multipart sink, so the blob is staged whole and uploaded at the end."""

        @staticmethod
        def sink(url: str) -> None:
            return None

    try:
        with tempfile.TemporaryDirectory(prefix="packer-remote-blob-") as tmp:
            cases = {
                "(a) local blob": (str(Path(tmp) / "local.blob"), Path(tmp), real),
                "(b) s3:// streamed (multipart)": ("s3://bench/streamed.blob", remote.staging_folder("s3://bench/streamed.blob"), real),
                "(c) s3:// staged whole": ("s3://bench/staged.blob", remote.staging_folder("s3://bench/staged.blob"), StagedWhole),
            }
            for name, (dst, watch, kind) in cases.items():
                watch.mkdir(parents=True, exist_ok=True)
                BlobWriter.remote = kind
                peaks: list[int] = []

                def one_pass() -> int:
                    with PeakDisk(watch) as peak:
                        report = convert(src, dst, format="blob", image=image, overwrite=True)
                    peaks.append(peak.peak)
                    return report.written

                results[name] = (measure(one_pass, repeats=args.repeats), max(peaks))
        fs.invalidate_cache()
        size = fs.size("bench/streamed.blob")
        assert fs.size("bench/staged.blob") == size
    finally:
        BlobWriter.remote = real
        proc.kill()
    rows = [[name, str(rate), f"{rate.median / results['(a) local blob'][0].median:.2f}x", f"{peak / 1e6:,.0f} MB ({peak / size:.0%})"]
            for name, (rate, peak) in results.items()]
    print(f"\n{args.images} images to raw 224x224 blobs of {size / 1e6:,.0f} MB, {cpu_count()} cores, moto S3 on 127.0.0.1\n")
    print(markdown_table(["DST", "img/s", "vs local", "peak local disk (of the blob)"], rows))
    out = save_json("remote_blob", {"machine": machine(), "images": args.images, "blob_bytes": size,
                                    "rows": {name: {"rate": rate, "peak_local_bytes": peak} for name, (rate, peak) in results.items()}},
                    output_dir(args.update_results, args.out))
    print(f"saved {out}")


if __name__ == "__main__":
    run_main(main)
