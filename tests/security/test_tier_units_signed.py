"""Every offload-tier unit is authenticated (docs/security.md, docs/offload.md).

The identity review found that without ``EXECSTATE_KV_SECRET`` a unit on disk whose KV was
replaced and whose checksum was recomputed was loaded and used (the output changed), and that a
shared tier started without any secret. Now a unit always carries a signature: the instances'
shared ring when configured, else a key only the writing engine knows. So, with and without a
configured secret:

- a forgery (KV replaced, checksum recomputed, signed with any other key) is refused;
- a swap (a valid unit of one block stored under another block's key) is refused;
- a unit written by another engine is refused unless both share the secret;
- a Redis tier does not start without the shared secret.

Refused means recomputed: the tokens equal a run that never had a tier.
"""

from __future__ import annotations

import msgspec
import pytest
from tier_engines import BS, churn, keys_of, make, prompt

from execstate import LLM, SamplingParams
from execstate.identity.checksum import checksum
from execstate.identity.secret_ring import SecretRing
from execstate.state.tiers.unit import sign
from execstate_bench.offload_desync import UnitAccess

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
SECRET = "tier-units-shared-secret-0123456789"
ATTACKER = SecretRing(b"what-an-attacker-might-try-0123")
BLOCK = 2


@pytest.fixture(autouse=True)
def _no_ambient_secret(monkeypatch):
    monkeypatch.delenv("EXECSTATE_KV_SECRET", raising=False)


def disk_engine(model_dir, tmp_path, secret: str | None, name: str = "disk"):
    kw = {"offload_disk_dir": str(tmp_path / name)}
    if secret is not None:
        kw["offload_secret"] = secret
    return make(model_dir, 16, max_model_len=128, **kw)


def tokens(llm, ids):
    return llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]


@pytest.fixture(scope="module")
def oracle(model_dir):
    return make(model_dir, 64)


@pytest.mark.parametrize("secret", [None, SECRET], ids=["per-engine key", "shared secret"])
@pytest.mark.parametrize("attack", ["forged", "swapped"])
def test_a_forged_or_swapped_unit_is_refused_and_recomputed(model_dir, tmp_path, oracle, secret, attack):
    llm = disk_engine(model_dir, tmp_path, secret)
    a, b = prompt(1), prompt(2)
    tokens(llm, a), tokens(llm, b)
    ka, kb = keys_of(llm, a), keys_of(llm, b)
    churn(llm, ka + kb)
    acc = UnitAccess(llm)
    rec, routes, kv = acc.read(ka[BLOCK])
    o_rec, o_routes, o_kv = acc.read(kb[BLOCK])
    if attack == "forged":  # the other block's bytes, every checksum recomputed, signed with a guess
        forged = msgspec.structs.replace(rec, kv_checksum=checksum(o_kv), routes_checksum=checksum(o_routes))
        acc.write(ka[BLOCK], sign(forged, ATTACKER), o_routes, o_kv)
    else:  # a genuine unit, filed under another block's key
        acc.write(ka[BLOCK], o_rec, o_routes, o_kv)
    tier = llm.engine.offload.tiers()[0]
    before = tier.stats.snapshot().checksum_failures
    out = tokens(llm, a)
    assert tier.stats.snapshot().checksum_failures == before + 1
    assert out.prompt_token_sources["offloaded"] == BLOCK * BS  # the blocks before it reloaded, the rest recomputed
    want = tokens(oracle, a)
    assert out.outputs[0].token_ids == want.outputs[0].token_ids
    assert (out.outputs[0].routed_experts == want.outputs[0].routed_experts).all()


@pytest.mark.parametrize(("secret", "shared"), [(None, False), (SECRET, True)],
                         ids=["per-engine keys", "shared secret"])
def test_another_engines_units_are_readable_only_with_the_shared_secret(model_dir, tmp_path, secret, shared):
    writer = disk_engine(model_dir, tmp_path, secret, "shared-dir")
    ids = prompt(3)
    tokens(writer, ids)
    churn(writer, keys_of(writer, ids))
    reader = disk_engine(model_dir, tmp_path, secret, "shared-dir")
    out = tokens(reader, ids)
    assert out.prompt_token_sources["offloaded"] == (len(ids) // BS * BS if shared else 0)
    assert out.outputs[0].token_ids == tokens(writer, ids).outputs[0].token_ids


def test_a_shared_tier_does_not_start_without_the_shared_secret(model_dir, redis_server):
    with pytest.raises(ValueError, match="shared secret"):
        LLM(str(model_dir), num_kv_blocks=16, max_model_len=128, offload_redis_url=redis_server.url)
