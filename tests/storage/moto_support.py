"""A real moto S3 server in a subprocess, for tests.

`moto_server()` starts it on a free port and yields its endpoint URL. Run as a script,
this file serves moto's app like `moto_server` does, with two additions:
- writes are serialized: moto checks If-None-Match and stores the object in two
  unlocked steps, so two concurrent conditional PUTs could both succeed, where S3
  decides them atomically. Reads stay concurrent.
- keys under a folder named in FAULTS fail once in a chosen way, so retries are
  tested against real HTTP exchanges.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from typing import Any

TEST_BUCKET = "bucketlog-test"
TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def moto_server(startup_timeout: float = 30.0) -> Iterator[str]:
    """Run a moto S3 server until the block ends; yields "http://127.0.0.1:<port>"."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + startup_timeout
        while not _answers(url):
            if process.poll() is not None:
                raise RuntimeError(f"moto server exited with {process.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not answer on {url}")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/moto-api/", timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer means it is up
    except OSError:
        return False


FAULTS = (
    "fault-slowdown",
    "fault-lost-put",
    "fault-conflict",
    "fault-cut-body",
    "fault-no-conditional",
)


def _error(status: str, code: str) -> tuple[str, list[tuple[str, str]], bytes]:
    body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code></Error>".encode()
    return status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))], body


def _test_server_app(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """moto's app with writes serialized, and faults for keys under a FAULTS folder.

    A request whose path holds "/<fault>/" fails once (per method and path):
    fault-slowdown answers 503 SlowDown; fault-lost-put stores the object but answers
    500, as when a response is lost; fault-conflict answers 409
    ConditionalRequestConflict; fault-cut-body sends half the body and hangs up.
    fault-no-conditional answers every PUT with If-None-Match 501 NotImplemented, like a
    store without conditional writes.
    """
    lock = threading.Lock()
    seen: set[tuple[str, str]] = set()

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method, path = environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")
        fault = next((f for f in FAULTS if f"/{f}/" in path), None)
        with lock:
            first = fault is not None and (method, path) not in seen
            seen.add((method, path))
        if fault == "fault-no-conditional" and method == "PUT" and "HTTP_IF_NONE_MATCH" in environ:
            status, headers, body = _error("501 Not Implemented", "NotImplemented")
        elif first and fault == "fault-slowdown":
            status, headers, body = _error("503 Slow Down", "SlowDown")
        elif first and fault == "fault-conflict" and method == "PUT":
            status, headers, body = _error("409 Conflict", "ConditionalRequestConflict")
        elif first and fault == "fault-lost-put" and method == "PUT":
            with lock:
                list(app(environ, lambda *args: None))
            status, headers, body = _error("500 Internal Server Error", "InternalError")
        elif first and fault == "fault-cut-body" and method == "GET":
            return _cut_body(app, environ, start_response)
        elif method in ("GET", "HEAD"):
            return app(environ, start_response)
        else:
            with lock:
                # Drain the response inside the lock: moto may do the work lazily.
                return list(app(environ, start_response))
        start_response(status, headers)
        return [body]

    return wrapped


def _cut_body(
    app: Callable[..., Iterable[bytes]],
    environ: dict[str, Any],
    start_response: Callable[..., Any],
) -> Iterable[bytes]:
    answer: list[Any] = []
    body = b"".join(app(environ, lambda status, headers, *_: answer.extend((status, headers))))
    status, headers = answer
    headers = [(k, v) for k, v in headers if k.lower() != "connection"]
    start_response(status, [*headers, ("Connection", "close")])
    return [body[: len(body) // 2]]


def _serve(port: int) -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        "127.0.0.1",
        port,
        _test_server_app(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
