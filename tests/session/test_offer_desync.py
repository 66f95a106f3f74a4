"""The desync harness (benchmarks/execstate_bench/desync.py) over live session migration offers: the kinds that apply to
an offer today (the KV of another block in the exported blocks, route rows of another block, a
record naming other tokens, another weights version at the target, a truncated offer, another
tenant's salt, an offer signed with another secret) are each detected before the target serves
anything (100 %) and answered by a clear error; the source keeps serving, with the tokens and routes
of a session that never tried to migrate.

Desyncs written by the source itself (its control state and its KV out of step) are re-signed with
the shared secret, so the check that catches them is the one about their content, not the
signature. The kinds of hibernation (stale step, stale epoch, truncated manifest) are
benchmarks/execstate_bench/hibernation_desync.py's (tests/session/test_hibernation_desync.py).
"""

from __future__ import annotations

import itertools
import secrets

import msgspec
import numpy as np
import pytest
from migration_helpers import SECRET, Engines, assert_holds_nothing
from session_helpers import GREEDY, make_llm, tokens

from execstate.identity.secret_ring import SecretRing
from execstate.session.lm.migration import wait_import
from execstate.session.lm.migration_source import begin_export, finish_export
from execstate.session.lm.migration_target import begin_import
from execstate.session.lm.migration_wire import MigrationError, SessionOffer, decode_offer, encode_offer
from execstate_bench.desync import TrialResult, detection_table, run_trials

KEY = SecretRing(SECRET.encode())
OFFER_KINDS = ("kv_other_block", "routes_other_block", "record_other_tokens", "other_weights", "truncated",
               "other_tenant", "forged_unit")
CAUGHT_BY = {"kv_other_block": "checksum_mismatch", "routes_other_block": "route_mismatch",
             "record_other_tokens": "key_mismatch", "other_weights": "incompatible", "truncated": "invalid",
             "other_tenant": "key_mismatch", "forged_unit": "unauthorized"}


class OfferTarget:
    name = "migration offer"

    def __init__(self, engines: Engines, other_weights_dir) -> None:
        self.engines = engines
        self.src, self.dst = engines(), engines()
        self.other = engines(path=other_weights_dir)
        self.ids = itertools.count()

    def kinds(self):
        return list(OFFER_KINDS)

    def trial(self, kind: str) -> TrialResult:
        n = next(self.ids)
        a, b = tokens(500 + n, 40), tokens(600 + n, 6)  # 40 tokens: blocks 0 and 1 full, exported
        sid = f"desync-{n}"
        s = self.src.open_session(sampling_params=GREEDY, session_id=sid)
        s.step(a)
        donor = self.src.open_session(sampling_params=GREEDY, session_id=f"donor-{n}")
        donor.step(tokens(700 + n, 40))
        target = self.other if kind == "other_weights" else self.dst
        out = begin_export(self.src.sessions, sid, 30.0, target_engine_id=target.engine.pd.instance_id,
                           nonce=secrets.token_hex(16))
        restore = None
        try:
            payload, restore = self._inject(kind, out, donor)
            try:
                handle = begin_import(target.sessions, payload)
                wait_import(target.sessions, handle, out)
                detected, answered, detail = False, "used", "migrated"
            except MigrationError as e:
                detected, answered, detail = True, "error", e.code
        finally:
            if restore is not None:
                restore()
            finish_export(self.src.sessions, out, ok=False)
        assert_holds_nothing(target, sid)
        ref = make_llm(self.engines.path).open_session(sampling_params=GREEDY)
        want = [ref.step(a), ref.step(b)][1]
        got = s.step(b)  # the source serves on, as if it never tried
        wrong = got.token_ids != want.token_ids or got.routed_experts.tobytes() != want.routed_experts.tobytes()
        s.close()
        donor.close()
        return TrialResult(self.name, kind, detected, answered, wrong, detail)

    def _inject(self, kind: str, out, donor):
        offer, _ = decode_offer(out.payload, KEY)
        eng = self.src.engine
        if kind == "kv_other_block":  # the exported block 1 now holds the donor session's block 1
            victim = out.runtime.state.blocks.block_ids[1]
            other = donor._sessions.manager.get(donor.session_id).state.blocks.block_ids[1]
            saved = np.empty(eng.kv_pool.unit_nbytes(), dtype=np.uint8)
            eng.kv_pool.export_block(victim, saved)
            eng.kv_pool.copy_blocks([(other, victim)])
            return out.payload, lambda: eng.kv_pool.import_block(victim, saved)
        if kind == "routes_other_block":
            rows = np.frombuffer(offer.route_rows, dtype="<i2").reshape(len(offer.token_ids) - 1, -1).copy()
            rows[16:32] = rows[0:16]  # block 1's rows are block 0's
            return self._resigned(offer, route_rows=rows.tobytes()), None
        if kind == "record_other_tokens":
            ids = list(offer.token_ids)
            ids[20] = (ids[20] + 1) % 500 + 3
            return self._resigned(offer, token_ids=ids), None
        if kind == "other_weights":
            return out.payload, None
        if kind == "truncated":
            return out.payload[:-40], None
        if kind == "other_tenant":
            return self._resigned(offer, cache_salt="another-tenant"), None
        if kind == "forged_unit":
            ids = list(offer.token_ids)
            ids[20] = (ids[20] + 1) % 500 + 3
            forged = msgspec.structs.replace(offer, token_ids=ids)
            return encode_offer(forged, SecretRing(b"another-secret-0123456789abcdef")), None
        raise ValueError(kind)

    @staticmethod
    def _resigned(offer: SessionOffer, **changes) -> bytes:
        return encode_offer(msgspec.structs.replace(offer, **changes), KEY)


@pytest.fixture()
def engines(moe_dir):
    built = Engines(moe_dir)
    yield built
    built.close()


def test_every_offer_desync_is_detected_before_use(engines, moe_dir_other_weights):
    results = run_trials([OfferTarget(engines, moe_dir_other_weights)])
    assert [r.kind for r in results] == list(OFFER_KINDS)
    for r in results:
        assert r.detected and r.answered == "error" and not r.wrong, r
        assert r.detail == CAUGHT_BY[r.kind], r
    assert all(row.rate == 1.0 and row.wrong == 0 for row in detection_table(results))
