"""Fixtures shared by several test directories.

``torch_single_thread``: torch runs single-threaded, restored afterwards. The models in the
tests are tiny; with 2 intra-op threads on a loaded 2-core machine every small GEMM waits for
a second thread to be scheduled (measured: 25 ms instead of 10 us per linear; generation ~4x
slower, 5.4 s vs 1.3 s for 24 tokens). One thread makes the tests fast and their timings
stable. A directory opts in with an autouse fixture that requests it (tests/model,
tests/embedded).

The test directories are not Python packages, so pytest resolves ``scope="package"`` to the
session: once a directory has opted in, later directories also run single-threaded, and the
thread count is restored at the end of the run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="package")
def torch_single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- a real Redis server for the offload tier's tests (Debian's redis-server; .ci/run installs it) --


class RedisServer:
    """``redis-server`` on a free loopback port with its own directory; ``stop``/``kill``/``start``
    let a test take it down mid-run and bring it back (same port)."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        self.workdir = workdir
        self.extra = list(extra)
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        import redis

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
             "--save", "", "--appendonly", "no", "--daemonize", "no", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_timeout=0.5, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.02)
        client.close()

    def client(self):
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=5.0)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need_redis_server() -> None:
    """Skip without ``redis-server`` (fail in CI, where ``.ci/run`` installs it)."""
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (apt-get install redis-server)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")


@pytest.fixture()
def redis_server(tmp_path_factory) -> Iterator[RedisServer]:
    """A fresh ``redis-server`` for one test, stopped afterwards."""
    need_redis_server()
    server = RedisServer(tmp_path_factory.mktemp("redis"), "--enable-debug-command", "local")
    server.start()
    yield server
    server.kill()
