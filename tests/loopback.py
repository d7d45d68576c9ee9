"""Servers on the loopback interface for the remote-storage tests: a free port, and a moto S3
server (the ``s3`` fixture lives in conftest.py and uses these)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import socket
import threading
from pathlib import Path
from typing import Iterator

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port nothing listens on, on 127.0.0.1."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def restart_worker_server() -> None:
    """Stop the fork server the conversion workers come from (packer/parallel.py), so the next
    one starts with this process's environment: it keeps the one of its first use."""
    from multiprocessing import forkserver

    forkserver._forkserver._stop()  # (the method CPython's own tests use)


class HTTPServer(http.server.ThreadingHTTPServer):
    """http.server's threading server with a listen backlog for concurrent readers: with the
    default of 5, the connects of a worker reading ahead are dropped and retried after 1 s."""

    request_queue_size = 128


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """http.server's static files, with no request log in the test output."""

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def served(directory: Path) -> Iterator[str]:
    """``directory`` served by http.server on 127.0.0.1 (a thread): its base URL; stopped after."""
    server = HTTPServer((LOOPBACK, 0), functools.partial(QuietHandler, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
