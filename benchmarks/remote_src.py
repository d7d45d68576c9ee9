"""Converting from a URL SRC with an object store's latency: reads ahead vs one at a time.

    python -m benchmarks.remote_src                        # 2,000 ImageNet-like JPEGs, 30 ms per GET, 3 repeats
    python -m benchmarks.remote_src --images 500 --latency 0.05 --repeats 1

The SRC is the image folder served over HTTP by a separate process on 127.0.0.1 that waits
``--latency`` seconds before answering each GET (S3 answers a small GET in tens of ms), so a
worker that reads one image at a time spends most of its time waiting. Rows, median (min-max)
of ``--repeats`` after a warm-up:
(a) one worker's work unit on 200 images, reading one at a time (what every worker did before
    read-ahead): ``[ImageTask(...)(item) for item in items]``;
(b) the same with read-ahead, ``ImageTask(...).map(items)`` (packer/sources/remote.py);
(c) a whole conversion (LMDB, raw 224, all cores) from the HTTP SRC, against (d) the same from
    the local folder, in the same run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packer import ImageOptions, convert
from packer.preprocess.task import ImageTask
from packer.sources.images import scan_image_folder

from .common import Rate, add_output_arguments, cpu_count, imagenet_like, machine, markdown_table, measure, output_dir, save_json, run_main

#: The HTTP server: a directory listing and files, each GET answered after a delay.
SERVER = """
import functools, http.server, sys, time
class Slow(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        time.sleep(float(sys.argv[3]))
        super().do_GET()
    def log_message(self, *args):
        pass
class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 256  # the default listen backlog of 5 drops concurrent connects (1 s SYN retry)
server = Server(("127.0.0.1", int(sys.argv[2])), functools.partial(Slow, directory=sys.argv[1]))
server.serve_forever()
"""


def slow_http_server(root: Path, latency: float) -> tuple[subprocess.Popen, str]:
    """``root`` served over HTTP on a free loopback port by a separate process, and its URL."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(root.parent), str(port), str(latency)])
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, f"http://127.0.0.1:{port}/{root.name}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the HTTP server did not start")


def server_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) the process ``pid`` used so far (Linux ``/proc``)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.03, help="seconds the server waits before each GET")
    parser.add_argument("--repeats", type=int, default=3)
    add_output_arguments(parser)
    args = parser.parse_args()
    src = imagenet_like(args.images)
    image = ImageOptions(size=224)
    proc, url = slow_http_server(src, args.latency)
    rates: dict[str, Rate] = {}
    try:
        items = scan_image_folder(url).items
        sample = items[:: max(1, len(items) // 200)][:200]
        task = ImageTask(image)
        rates["(a) one worker, one read at a time"] = measure(lambda: sum(1 for item in sample if task(item)), repeats=args.repeats)
        rates["(b) one worker, reads ahead"] = measure(lambda: sum(1 for _ in task.map(sample)), repeats=args.repeats)
        started = time.perf_counter()
        scan_image_folder(url)
        listing = time.perf_counter() - started
        with tempfile.TemporaryDirectory(prefix="packer-remote-src-") as tmp:
            for name, source in [(f"(c) conversion from HTTP, {args.latency * 1e3:g} ms a GET", url), ("(d) conversion from the local folder", str(src))]:
                dst = Path(tmp) / "out.lmdb"
                cpu_before = server_cpu_seconds(proc.pid)
                rates[name] = measure(lambda: convert(source, dst, image=image, overwrite=True).written, repeats=args.repeats)
                if source == url:
                    server_cpu = (server_cpu_seconds(proc.pid) - cpu_before) / (args.repeats + 1)
    finally:
        proc.kill()
    local = rates["(d) conversion from the local folder"].median
    rows = [[name, str(rate), f"{rate.median / local:.2f}x" if name.startswith("(c)") else ""] for name, rate in rates.items()]
    print(f"\n{len(items)} ImageNet-like JPEGs to raw 224, {cpu_count()} cores, HTTP on 127.0.0.1 with {args.latency * 1e3:g} ms per GET\n")
    print(markdown_table(["what", "img/s", "vs local folder"], rows))
    wall = len(items) / rates[next(name for name in rates if name.startswith("(c)"))].median
    print(f"\nof a (c) pass ({wall:.1f} s): listing the SRC {listing:.2f} s; the HTTP server process used {server_cpu:.1f} s of CPU")
    out = save_json("remote_src", {"machine": machine(), "images": len(items), "latency_s": args.latency, "rates": rates,
                                   "listing_s": listing, "server_cpu_s_per_pass": server_cpu}, output_dir(args.update_results, args.out))
    print(f"saved {out}")


if __name__ == "__main__":
    run_main(main)
