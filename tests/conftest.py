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
from collections.abc import Iterator

import pytest
import torch

from execstate_bench.redis_server import RedisServer, redis_server_available


@pytest.fixture(scope="package")
def torch_single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- a real Redis server for the offload tier's tests (Debian's redis-server; .ci/run installs it) --


def need_redis_server() -> None:
    """Skip without ``redis-server`` (fail in CI, where ``.ci/run`` installs it)."""
    if not redis_server_available():
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (apt-get install redis-server)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")


@pytest.fixture()
def redis_server(tmp_path_factory) -> Iterator[RedisServer]:
    """A fresh ``redis-server`` for one test on a free loopback port, killed afterwards."""
    need_redis_server()
    server = RedisServer(tmp_path_factory.mktemp("redis"), "--enable-debug-command", "local")
    server.start()
    yield server
    server.kill()


@pytest.fixture()
def redis_factory(tmp_path_factory) -> Iterator:
    """``make(*redis_server_args)``: more servers for one test (their own options), killed afterwards."""
    need_redis_server()
    made: list[RedisServer] = []

    def make(*extra: str) -> RedisServer:
        server = RedisServer(tmp_path_factory.mktemp("redis"), *extra)
        made.append(server)
        return server.start()

    yield make
    for server in made:
        server.kill()
