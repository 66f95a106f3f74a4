"""The slow Ray fleet tests' local cluster: Ray on 2 CPUs, Serve's HTTP proxy on a free port, one
fleet application deployed, the URL once its replicas registered, all shut down after."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx


@contextmanager
def local_fleet(build: Callable[[], Any], replicas: int, timeout_s: float = 90) -> Iterator[str]:
    """``build()`` (a ``fleet_app(...)``) deployed on a fresh local cluster; yields its URL once
    ``replicas`` engine replicas registered with the ingress."""
    import ray
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build(), name="execstate", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        registered(url, replicas, timeout_s)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()


def registered(url: str, n: int, timeout_s: float = 90) -> list[dict]:
    """The replicas registered with the fleet's ingress, once there are at least ``n``."""
    deadline = time.monotonic() + timeout_s
    while len(got := httpx.get(url + "/v1/fleet/replicas").json()["replicas"]) < n:
        assert time.monotonic() < deadline, f"{n} replicas did not register: {got}"
        time.sleep(0.2)
    return got
