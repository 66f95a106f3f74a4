"""Helpers for the session migration tests: engines with PD connectors (optionally loading through
the fault-injecting importer), in-place reference runs, and the checks that a failed migration
left the source serving and the target holding nothing."""

from __future__ import annotations

from pathlib import Path

from session_helpers import check_accounting, make_llm

from execstate import LLM, SamplingParams
from execstate.engine.pd_connector import PDConfig
from execstate.session.lm.step import StepResult
from execstate_bench.faults import FaultInjection, importer_factory

SECRET = "session-migration-test-secret-0123"


class Engines:
    """Builds LLMs with PD connectors and closes every connector at the end of a test."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.built: list[LLM] = []

    def __call__(self, role: str = "kv_both", faults: dict | None = None, path: Path | None = None,
                 llm_kw: dict | None = None, **pd_kw) -> LLM:
        pd_kw.setdefault("secret", SECRET)
        pd_kw.setdefault("timeout_s", 5.0)
        cfg = PDConfig(role=role, **pd_kw)
        make_importer = None if faults is None else importer_factory(FaultInjection.from_dict(faults))
        llm = make_llm(path or self.path, kv_transfer=cfg, make_importer=make_importer, **(llm_kw or {}))
        self.built.append(llm)
        return llm

    def close(self) -> None:
        for llm in self.built:
            if llm.engine.pd is not None:
                llm.engine.pd.close()


def in_place(path: Path, params: SamplingParams, inputs: list[list[int]]) -> tuple[list[StepResult], object]:
    """Step a fresh session (no PD) through ``inputs``; its results and the session."""
    llm = make_llm(path)
    s = llm.open_session(sampling_params=params)
    return [s.step(x) for x in inputs], s


def assert_same_steps(got: list[StepResult], want: list[StepResult]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
        assert g.step_index == w.step_index
        assert g.routed_experts.tobytes() == w.routed_experts.tobytes()


def assert_holds_nothing(llm: LLM, session_id: str) -> None:
    """The target after a failed migration: no such session, no holds, no block in use."""
    eng = llm.engine
    eng.poll()
    assert all(rt.session_id != session_id for rt in llm.sessions.manager.resident())
    assert eng.kv_holds.num_holders == 0
    assert eng.block_pool.num_used == 0
    assert eng.pd is None or eng.pd.num_loads_inflight == 0
    check_accounting(llm)


def assert_source_released(llm: LLM) -> None:
    """The source after a successful migration: its session and export are gone."""
    eng = llm.engine
    eng.poll()
    assert eng.kv_holds.num_holders == 0 and eng.block_pool.num_used == 0
    assert eng.pd is None or eng.pd.num_pinned_exports == 0
    check_accounting(llm)
