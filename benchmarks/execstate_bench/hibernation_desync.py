"""The desync harness's hibernation target (``execstate_bench/desync.py``): one side of a hibernated LM
session corrupted per trial (``session/lm/hibernation.py``).

Each trial opens a session on an engine with a DRAM tier and its twin on an oracle engine
without tiers, steps both, hibernates the session, injects one desync, and steps both again:

- ``stale_step`` / ``stale_epoch``: the manifest replaced by a validly signed one whose step
  index / event epoch is older (a stale writer holding the secret): caught by the session state
  key check before use (error ``desync``, the session FAILED);
- ``truncated_manifest``: the manifest cut short: refused when decoded (error);
- ``other_tenant``: the manifest names the units of the same tokens under another tenant's salt:
  caught by the unit-key check (error);
- ``kv_other_block``: a unit's KV bytes in the DRAM tier replaced by another block's: caught by
  the reload's checksum (recompute: the step equals the twin's).

A trial is ``wrong`` when a step served tokens or routes other than the twin's.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from execstate.engine.offload import OffloadConnector
from execstate.engine.sampling_params import SamplingParams
from execstate.identity.scope import CacheScope
from execstate.session.lm import hibernation as hib
from execstate.session.lm.hibernation_state import block_units
from execstate.session.lm.hibernation_wire import decode_manifest, digest, encode_manifest
from execstate.session.lm.llm import LLM
from execstate.session.lm.offline import Session
from execstate.session.lm.step import StepResult
from execstate.session.runtime.events import SessionEventError
from execstate.state.block_holds import HeldBlocks
from execstate.state.block_pool import BlockId
from execstate_bench.desync import TrialResult

PARAMS = SamplingParams(temperature=0.8, seed=5, max_tokens=4, ignore_eos=True)


class HibernationDesyncTarget:
    name = "hibernation"

    def __init__(self, model: Path, oracle: LLM, seed: int = 0) -> None:
        self.llm = LLM(str(model), enable_return_routed_experts=True, num_kv_blocks=48, block_size=16, seed=0,
                       offload_dram_bytes=32 << 20, offload_secret="hibernation-desync-secret-0123")
        self.oracle = oracle
        self.n = seed * 1000

    def _offload(self) -> OffloadConnector:
        off = self.llm.engine.offload
        assert off is not None  # offload_dram_bytes above
        return off

    def kinds(self) -> list[str]:
        return ["stale_step", "stale_epoch", "truncated_manifest", "other_tenant", "kv_other_block"]

    def close(self) -> None:
        self.llm.sessions.close_all()
        if self.llm.engine.offload is not None:
            self.llm.engine.offload.close()

    def trial(self, kind: str) -> TrialResult:
        self.n += 1
        prompt = [(self.n * 7 + i * 13) % 400 + 3 for i in range(70)]
        s, t = self.llm.open_session(sampling_params=PARAMS), self.oracle.open_session(sampling_params=PARAMS)
        try:
            s.step(prompt), t.step(prompt)
            record = hib.hibernate(self.llm.sessions, s.session_id)
            record.publish(self._offload().flush)
            if kind == "kv_other_block":
                return self._kv_other_block(kind, s, t)
            self._corrupt_manifest(kind, record, s)
            try:
                got = s.step([9, 10])
            except SessionEventError as e:
                return TrialResult(self.name, kind, True, "error", False, f"{e.code}: {e.message}")
            want = t.step([9, 10])
            return TrialResult(self.name, kind, False, "used", _differs(got, want), "nothing noticed")
        finally:
            s.close()
            t.close()

    def _corrupt_manifest(self, kind: str, record: hib.Hibernated, s: Session) -> None:
        secret = self._offload().ring
        m = decode_manifest(record.manifest, secret, require_signature=True)
        o = m.offer
        if kind == "truncated_manifest":
            data = record.manifest[: len(record.manifest) // 2]
        else:
            if kind == "stale_step":
                o = msgspec.structs.replace(o, step_index=o.step_index - 1)
            elif kind == "stale_epoch":
                o = msgspec.structs.replace(o, event_epoch=o.event_epoch + 1, max_event_epoch=o.max_event_epoch + 1)
            elif kind == "other_tenant":
                eng = self.llm.engine
                other = eng.kv_manager.identity(CacheScope.build("another-tenant"))
                held = HeldBlocks([BlockId(i) for i in range(len(o.token_ids) // 16 + 1)], len(o.token_ids))
                keys = [u[1] for u in block_units(o.token_ids, other, held, None, eng.block_size)]
                m = msgspec.structs.replace(m, unit_keys=[bytes(k) for k in keys])
            m = msgspec.structs.replace(m, offer=o)
            data = encode_manifest(m, secret)
        record.manifest, record.digest = data, digest(data)  # a consistent record: only the checks can tell

    def _kv_other_block(self, kind: str, s: Session, t: Session) -> TrialResult:
        eng = self.llm.engine
        keys = list(s.sessions.manager.get(s.session_id, s.access, wake=False).hibernation.unit_keys)
        pool = eng.block_pool
        pool.free(pool.allocate(pool.num_free))  # the pool forgets them: the next step reloads
        assert self._offload().flush()  # every unit sealed in DRAM
        host = self._offload().host
        a, b = host.acquire(keys[1]), host.acquire(keys[2])
        if a is None or b is None:
            raise RuntimeError("the session's units are not in the DRAM tier")
        a[2][:] = b[2]
        host.unpin(keys[1])
        host.unpin(keys[2])
        got, want = s.step([9, 10]), t.step([9, 10])
        done = self._offload().loads.last_done
        caught = done is not None and any(f.kind == "checksum" for f in done.failures)
        return TrialResult(self.name, kind, caught, "recompute" if caught else "used", _differs(got, want),
                           "checksum: the reload refused the unit" if caught else "nothing noticed")


def _differs(got: StepResult, want: StepResult) -> bool:
    g = None if got.routed_experts is None else got.routed_experts.tobytes()
    w = None if want.routed_experts is None else want.routed_experts.tobytes()
    return got.token_ids != want.token_ids or g != w
