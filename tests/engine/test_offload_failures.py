"""A tier that is down, slow or full degrades to recompute with a warning: every request is served
with the tokens and routes of a cold run, none fails, the pool never waits, the engine's state stays
consistent (docs/offload.md "Failure")."""

from __future__ import annotations

import logging
import shutil
import time

import pytest
from offload_helpers import check_clean, churn, close, keys_of, make, prompt, run, same_output


@pytest.fixture(scope="module")
def cold(moe_dir):
    return make(moe_dir, num_kv_blocks=64)


def test_redis_stopped_mid_run(moe_dir, cold, redis_server, caplog):
    llm = make(moe_dir, offload_redis_url=redis_server.url, offload_timeout_s=0.5)
    store = llm.engine.offload.stores[0]
    store.health.backoff_s = 0.3
    try:
        a, b = prompt(21), prompt(22)
        run(llm, a)
        churn(llm, keys_of(llm, a))
        redis_server.kill()
        with caplog.at_level(logging.WARNING, logger="execstate.offload"):
            out = run(llm, a)
        same_output(out, run(cold, a))
        assert out.error is None and out.prompt_token_sources["offloaded"] == 0
        assert "offload tier redis is unavailable" in caplog.text
        assert not llm.engine.offload.snapshot()[0].available
        same_output(run(llm, b), run(cold, b))  # the server goes on without its tier
        redis_server.start()  # back (empty)
        time.sleep(0.35)
        run(llm, b)
        churn(llm, keys_of(llm, b))
        out = run(llm, b)
        assert out.prompt_token_sources["offloaded"] == 96  # written and served again
        same_output(out, run(cold, b))
        assert llm.engine.offload.snapshot()[0].available
        check_clean(llm)
    finally:
        close(llm)


def test_slow_redis_passes_the_deadline_and_recomputes(moe_dir, cold, redis_server):
    llm = make(moe_dir, offload_redis_url=redis_server.url, offload_timeout_s=0.3)
    try:
        a = prompt(23)
        run(llm, a)
        churn(llm, keys_of(llm, a))
        redis_server.client().execute_command("CLIENT", "PAUSE", "4000", "ALL")
        t0 = time.monotonic()
        out = run(llm, a)
        elapsed = time.monotonic() - t0
        same_output(out, run(cold, a))
        assert out.prompt_token_sources["offloaded"] == 0
        assert elapsed < 3.5  # bounded by the timeout, not by the server's 4 s pause
        assert llm.engine.offload.snapshot()[0].errors >= 1
        check_clean(llm)
    finally:
        close(llm)


def test_full_tiers_drop_their_oldest_and_never_block(moe_dir, cold):
    llm = make(moe_dir, offload_dram_bytes=1)  # less than a unit: no DRAM tier, staging only
    assert llm.engine.offload.tiers() == []
    unit = llm.engine.kv_pool.unit_nbytes()
    close(llm)
    llm = make(moe_dir, offload_dram_bytes=8 * unit)  # 8 units: a 100-token prompt has 6
    try:
        prompts = [prompt(30 + i) for i in range(6)]
        for p in prompts:
            run(llm, p)
        churn(llm, keys_of(llm, prompts[-1]))
        snap = llm.engine.offload.snapshot()[0]
        assert snap.units == 8 and snap.dropped.get("full", 0) > 0
        out = run(llm, prompts[0])  # long gone from DRAM
        same_output(out, run(cold, prompts[0]))
        assert out.prompt_token_sources["offloaded"] == 0
        llm.engine.offload.host.check_integrity()
        check_clean(llm)
    finally:
        close(llm)


def test_disk_that_fails_to_write(moe_dir, cold, tmp_path, caplog):
    d = tmp_path / "disk"
    llm = make(moe_dir, offload_disk_dir=str(d))
    try:
        shutil.rmtree(d)
        d.write_bytes(b"")  # the directory is now a file: every write fails
        a = prompt(24)
        with caplog.at_level(logging.WARNING, logger="execstate.offload"):
            run(llm, a)
            churn(llm, keys_of(llm, a))
        out = run(llm, a)
        same_output(out, run(cold, a))
        assert out.prompt_token_sources["offloaded"] == 0
        assert "offload tier disk is unavailable" in caplog.text
        check_clean(llm)
    finally:
        close(llm)
