"""A throwaway ``redis-server`` for benchmarks and tests (Debian's ``redis-server`` package).

Started on a free loopback port with its own directory, no persistence (``--save ''``,
``--appendonly no``), the way docs/offload.md tells an operator to run the shared tier for one
machine; ``stop``/``kill``/``start`` take it down mid-run and bring it back on the same port.
A shared tier needs the instances' shared secret: :data:`SHARED_SECRET` is the one the benchmark's
engines share (drawn per process).
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

SHARED_SECRET = secrets.token_hex(32)


def redis_server_available() -> bool:
    return shutil.which("redis-server") is not None


class RedisServer:
    def __init__(self, workdir: Path, *extra: str, port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.extra = list(extra)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
                "--save", "", "--appendonly", "no", "--daemonize", "no", *self.extra]

    def start(self, timeout: float = 10.0) -> RedisServer:
        import redis

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_timeout=0.5, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.RedisError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        self.kill()
                        raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                    time.sleep(0.02)
        finally:
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
