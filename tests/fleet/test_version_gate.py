"""The replica's weights-version gate (``fleet/ray_app/version_gate.py``): a writer waits for the
requests in flight, requests arriving meanwhile wait for the writer, so none straddles a switch."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")  # the ray_app package needs the fleet extra

from execstate.fleet.ray_app.version_gate import VersionGate  # noqa: E402


def test_no_request_straddles_a_switch():
    async def main() -> list[str]:
        gate, log, version = VersionGate(), [], ["v0"]

        async def request(name: str, hold: float) -> None:
            async with gate.reading():
                seen = version[0]
                await asyncio.sleep(hold)
                log.append(f"{name}:{seen}->{version[0]}")

        async def update() -> None:
            async with gate.writing():
                log.append("switch")
                version[0] = "v1"

        first = asyncio.create_task(request("a", 0.05))
        await asyncio.sleep(0.01)
        writer = asyncio.create_task(update())
        await asyncio.sleep(0.01)
        late = asyncio.create_task(request("b", 0.0))  # arrives while the writer waits
        await asyncio.gather(first, writer, late)
        assert gate.readers == 0
        return log

    assert asyncio.run(main()) == ["a:v0->v0", "switch", "b:v1->v1"]


def test_a_failed_request_releases_its_pass():
    async def main() -> bool:
        gate = VersionGate()
        with pytest.raises(RuntimeError):
            async with gate.reading():
                raise RuntimeError("replica error")
        async with asyncio.timeout(1):
            async with gate.writing():
                return gate.readers == 0

    assert asyncio.run(main())
