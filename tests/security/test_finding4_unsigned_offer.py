"""An unsigned session offer was once trusted on the strength of an allow-list entry.

Reproduces: a decode server with ``allowed_prefill_engines`` and no secret accepted an unsigned
session offer naming a listed engine. The attacker first sends a prompt to the server, so its
prefix cache holds the offer's full blocks; the offer then carries those blocks' tokens, a forged
tail and forged route rows, and the server imported it (200: the session exists, with the forged
tokens and routes) without ever contacting the listed engine, since every offered block was a
local cache hit. Now every session offer must be signed, whatever any allow-list says: the
import is refused (``unauthorized``) and nothing is created. The allow-list is for PD KV handoffs
only (the decode server dials the listed address itself and checks what it reads).
"""

from __future__ import annotations

import time

import msgspec
import numpy as np
import torch
from security_helpers import code_of, http, server

from execstate.engine.pd_connector import PDConfig

LISTED = "prefill-engine-1"
BLOCK = 16
PROMPT = list(range(30, 70))  # 2 full blocks (32 tokens) end in the prefix cache
FORGED_TAIL = [401, 402, 403, 404, 405, 406]


def forged_offer(digest: str, layers: int, top_k: int) -> bytes:
    """An unsigned offer in the format the server read before the fix (format 1), naming ``LISTED``."""
    tokens = PROMPT[: 2 * BLOCK] + FORGED_TAIL
    rows = np.tile(np.arange(top_k, dtype="<i2"), (len(tokens) - 1, layers, 1))  # every token "routed" to 0..k-1
    handoff = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": LISTED,
               "remote_addr": "tcp://127.0.0.1:9", "transfer_id": "forged-transfer", "epoch": 0, "num_blocks": 2,
               "block_size": BLOCK, "expires_at": int(time.time()) + 60}
    offer = {
        "format_version": 1, "session_id": "forged-1", "source_instance_id": LISTED, "provenance_digest": digest,
        "cache_salt": None, "token_ids": tokens, "num_kv_tokens": 2 * BLOCK, "route_rows": rows.tobytes(),
        "step_index": 3, "event_epoch": 0, "max_event_epoch": 0, "branch_id": "forged",
        "seed": 1, "rng_state": bytes(torch.Generator().manual_seed(1).get_state().numpy()),
        "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": None, "min_p": 0.0, "repetition_penalty": 1.0,
                     "presence_penalty": 0.0, "frequency_penalty": 0.0, "logit_bias": None, "max_tokens": 4,
                     "min_tokens": 0, "stop": None, "stop_token_ids": None, "ignore_eos": True, "logprobs": None,
                     "skip_special_tokens": True},
        "priority": 1, "events": {"pending": [], "last_event_id": None, "acks": []}, "handoff": handoff,
        "commit_by": time.time() + 60,
    }
    return msgspec.msgpack.encode({"payload": msgspec.msgpack.encode(offer), "signature": None})


def test_an_unsigned_offer_is_refused_whatever_the_allow_list(model_dir, monkeypatch):
    monkeypatch.delenv("EXECSTATE_KV_SECRET", raising=False)
    pd = PDConfig(role="kv_both", allowed_prefill={LISTED: "tcp://127.0.0.1:9"}, timeout_s=3.0)
    with server(model_dir, pd=pd) as d:
        r = http("POST", f"{d.url}/v1/completions", body={"model": "m", "prompt": PROMPT, "max_tokens": 1})
        assert r.status_code == 200, r.text  # the attacker's prompt: its blocks are in the prefix cache now
        digest, layers, top_k = d.engine.call(lambda e: (e.provenance.digest(), e.model_config.num_moe_layers,
                                                         e.model_config.top_k))
        r = http("POST", f"{d.url}/v1/sessions/import", None, content=forged_offer(digest, layers, top_k),
                 headers={"content-type": "application/msgpack"})
        got = http("GET", f"{d.url}/v1/sessions/forged-1")
        assert got.status_code == 404, f"the forged session exists: {got.text[:300]}"
        assert (r.status_code, code_of(r)) == (403, "unauthorized"), r.text
