"""The kernels' team governor (``kernels/team.py``) and the per-step breakdown (``model/step_timers.py``).

Oracles: the governor's decisions for given call times (its contract: probe, switch, fall back,
back off, restore the configured size); an engine whose governor switches the team size at every
call gives the tokens and logprobs of an engine on the full team, bit for bit (the kernels are
thread-count invariant); the timers leave results unchanged and name every phase of a decode step.
"""

from __future__ import annotations

import numpy as np
import pytest

from execstate import LLM, SamplingParams
from execstate.engine.config import EngineConfig
from execstate.kernels import ext
from execstate.kernels.gemm import MAX_LINEAR_ROWS
from execstate.kernels.team import TeamGovernor, team_governor
from execstate.model.random_models import make_random
from execstate.model.step_timers import KERNEL_PHASES, SEGMENTS


class Threads:
    """A fake OpenMP thread setting: the configured size and every change the governor makes."""

    def __init__(self, full: int) -> None:
        self.full, self.now, self.sets = full, full, []

    def set(self, n: int) -> None:
        self.now = n
        self.sets.append(n)


def _gov(full: int = 2, **kw) -> tuple[TeamGovernor, Threads]:
    th = Threads(full)
    return TeamGovernor(th.set, lambda: th.full, **kw), th


def _calls(gov: TeamGovernor, th: Threads, team_s: float, solo_s: float, n: int, layers: int = 4) -> list[int]:
    """``n`` layer calls in one step, each taking ``team_s`` on the team and ``solo_s`` alone; the sizes used."""
    used = []
    with gov.step():
        for i in range(n):
            k = gov.before_call((i % layers, 1))
            assert th.now == k
            used.append(k)
            gov.after_call((i % layers, 1), team_s if k > 1 else solo_s)
    assert th.now == th.full  # restored after the step
    return used


def test_team_held_while_faster_and_probes_back_off() -> None:
    gov, th = _gov(min_interval=4, max_interval=16, probe_calls=2)
    used = _calls(gov, th, team_s=1.0, solo_s=1.3, n=80)  # solo slower, not by the fallback factor
    assert not gov.solo and gov.switches == 0
    solo_at = [i for i, k in enumerate(used) if k == 1]
    assert solo_at[:2] == [4, 5]  # the first probe after min_interval calls, probe_calls long
    gaps = np.diff([i for i in solo_at if i - 1 not in solo_at])
    assert list(gaps[:3]) == [2 + 8, 2 + 16, 2 + 16]  # each losing probe doubles the interval, up to the max
    assert (gov.calls, gov.solo_calls) == (80, 10) and used.count(1) == 10  # 5 probes of 2 calls


def test_calls_on_one_thread_are_counted_while_solo_is_held() -> None:
    gov, th = _gov(min_interval=4, max_interval=16, probe_calls=2)
    used = _calls(gov, th, team_s=2.0, solo_s=1.0, n=40)  # the team is slower: the governor goes solo
    # 4 team calls, then solo but for 3 team probes of 2 calls (the unmeasured wake-up, one lost call)
    assert gov.solo and used[:4] == [2] * 4 and used.count(2) == 10
    assert (gov.calls, gov.solo_calls) == (40, 30)


def test_descheduled_partner_falls_back_to_solo_at_once() -> None:
    gov, th = _gov(min_interval=4, probe_calls=2)
    _calls(gov, th, team_s=1.0, solo_s=1.8, n=12)  # solo estimates known for every layer
    assert not gov.solo
    used = _calls(gov, th, team_s=20.0, solo_s=1.8, n=4)  # a stalled team call: 20 > 1.5 x 1.8
    assert used[0] == 2 and used[1:] == [1, 1, 1]
    assert gov.solo and gov.switches == 1


def test_solo_probes_the_team_and_returns_when_it_is_faster() -> None:
    gov, th = _gov(min_interval=4, probe_calls=2)
    _calls(gov, th, team_s=1.0, solo_s=1.8, n=12)
    _calls(gov, th, team_s=20.0, solo_s=1.8, n=4)
    assert gov.solo
    used = _calls(gov, th, team_s=1.0, solo_s=1.8, n=12)  # the load is gone
    assert not gov.solo and gov.switches == 2
    assert used[-1] == 2


def test_losing_probe_stops_at_its_first_slow_call() -> None:
    gov, th = _gov(min_interval=4, probe_calls=3)
    _calls(gov, th, team_s=1.0, solo_s=1.8, n=12, layers=1)
    _calls(gov, th, team_s=20.0, solo_s=1.8, n=2, layers=1)
    assert gov.solo
    used = _calls(gov, th, team_s=20.0, solo_s=1.8, n=12, layers=1)
    assert used.count(2) == 2  # the unmeasured wake-up call, then one (20 > 1.5 x 1.8), not probe_calls
    assert gov.solo


def test_a_team_probe_does_not_measure_the_wake_up_of_idle_threads() -> None:
    gov, th = _gov(min_interval=4, probe_calls=2)
    _calls(gov, th, team_s=1.0, solo_s=1.8, n=12, layers=1)
    _calls(gov, th, team_s=20.0, solo_s=1.8, n=2, layers=1)
    assert gov.solo
    used: list[int] = []
    with gov.step():
        for _ in range(12):  # the load is gone, but a team call after a solo stretch pays the wake-up
            k = gov.before_call((0, 1))
            woken = used[-3:] == [1, 1, 1]
            used.append(k)
            gov.after_call((0, 1), 1.8 if k == 1 else (3.0 if woken else 1.0))
    assert used[:6] == [1, 1, 1, 2, 2, 2]  # the probe: the wake-up call (3.0 > 1.5 x 1.8, not measured), 2 calls
    assert not gov.solo and gov.switches == 2 and used[-1] == 2


def test_busy_step_work_gets_a_thread_and_is_not_measured() -> None:
    gov, th = _gov(min_interval=100)
    busy = [True, True, False, False]
    used = []
    with gov.step(lambda: busy[0] if busy else False):
        for i in range(4):
            used.append(gov.before_call((i, 1)))
            gov.after_call((i, 1), 50.0 if busy[0] else 1.0)  # slow while lent: not an estimate
            busy.pop(0)
    assert used == [1, 1, 2, 2]
    assert not gov.solo and gov.switches == 0 and th.now == 2
    assert _calls(gov, th, team_s=1.0, solo_s=1.8, n=4) == [2, 2, 2, 2]


def test_a_step_above_the_whole_layer_rows_runs_on_the_team_whatever_the_held_mode() -> None:
    gov, th = _gov(min_interval=4)
    _calls(gov, th, team_s=1.0, solo_s=1.8, n=12)
    _calls(gov, th, team_s=20.0, solo_s=1.8, n=2)
    assert gov.solo
    with gov.step(tokens=MAX_LINEAR_ROWS):  # a decode step: the held mode
        assert th.now == 1
    with gov.step(tokens=MAX_LINEAR_ROWS + 1):  # a prefill: its per-op calls are never measured
        assert th.now == 2
    assert th.now == 2 and gov.solo and gov.switches == 1  # the held mode stays for the decode calls
    assert _calls(gov, th, team_s=20.0, solo_s=1.8, n=1) == [1]


def test_large_steps_hold_their_own_mode_measured_per_step() -> None:
    now = [0.0]
    th = Threads(2)
    gov = TeamGovernor(th.set, lambda: th.full, clock=lambda: now[0])
    n = 2048
    used = []

    def large_steps(count: int, team_s: float, solo_s: float) -> None:
        for _ in range(count):
            with gov.step(tokens=n):
                used.append(th.now)
                now[0] += team_s if th.now > 1 else solo_s
            assert th.now == 2

    large_steps(300, team_s=0.4, solo_s=0.6)  # quiet: the team held, never a whole step solo to probe
    assert used == [2] * 300 and gov.large is not None and gov.large.probes == 0
    large_steps(8, team_s=0.55, solo_s=0.6)  # slower, not by the fallback factor: still no probe
    assert used[300:] == [2] * 8 and gov.large.probes == 0
    used.clear()
    large_steps(1, team_s=4.0, solo_s=0.6)  # a descheduled partner: 4.0 > 1.5 x 0.4, the best team step
    large_steps(3, team_s=4.0, solo_s=0.6)  # so the next step probes solo, wins, and solo is held
    assert used == [2, 1, 1, 1] and gov.large.solo and not gov.solo  # the decode calls' mode untouched
    with gov.step(tokens=n - 100):  # the same power of two: the held solo mode
        assert th.now == 1


def test_one_thread_configured_is_left_alone() -> None:
    gov, th = _gov(full=1, min_interval=1)
    assert _calls(gov, th, team_s=1.0, solo_s=5.0, n=10) == [1] * 10
    assert th.sets == []


def test_step_restores_after_an_error_and_is_not_reentrant() -> None:
    gov, th = _gov(min_interval=4)
    _calls(gov, th, team_s=1.0, solo_s=1.8, n=12)
    _calls(gov, th, team_s=20.0, solo_s=1.8, n=2)
    assert gov.solo
    with pytest.raises(ZeroDivisionError), gov.step():
        assert th.now == 1
        _ = 1 / 0
    assert th.now == 2
    with gov.step(), pytest.raises(RuntimeError, match="reentrant"), gov.step():
        pass


@pytest.mark.parametrize("kw", [dict(min_interval=0), dict(min_interval=8, max_interval=4), dict(probe_calls=0),
                                dict(gain=0.9), dict(fallback=1.0)])
def test_bad_settings_are_refused(kw) -> None:
    with pytest.raises(ValueError, match="TeamGovernor"):
        _gov(**kw)


def test_policy_names() -> None:
    assert team_governor("full", True) is None
    assert team_governor("adaptive", False) is None
    with pytest.raises(ValueError, match="kernel_team"):
        EngineConfig(model="x", kernel_team="half")


pytestmark_kernels = pytest.mark.skipif(not ext.available(), reason="CPU kernels unavailable")


@pytest.fixture(scope="module")
def wide_moe(tmp_path_factory):
    # wide enough that a whole-layer call forks (decode_layer.c PARALLEL_MIN_MACS)
    return make_random("qwen3_moe", tmp_path_factory.mktemp("wide"), seed=4, hidden_size=256,
                       intermediate_size=512, moe_intermediate_size=256, head_dim=64)


def _run(path, **kw):
    llm = LLM(str(path), kernels="execstate", enable_return_routed_experts=True, seed=0, **kw)
    return llm


def _gen(llm, prompts):
    return llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=12, ignore_eos=True, logprobs=2, temperature=0.0), use_tqdm=False)


@pytestmark_kernels
def test_switching_team_size_every_call_changes_no_bit(wide_moe) -> None:
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 500, n).tolist() for n in (7, 19, 11)]
    full = _gen(_run(wide_moe, kernel_team="full"), prompts)
    llm = _run(wide_moe, kernel_team="adaptive")
    sizes: list[int] = []

    def set_threads(n: int) -> None:
        sizes.append(n)
        ext.lib().set_threads(n)

    # a probe at every call: the team size alternates within each step
    llm.engine.runner.team = TeamGovernor(set_threads, ext.max_threads, min_interval=1, max_interval=1,
                                          probe_calls=1, gain=1.0)
    adaptive = _gen(llm, prompts)
    if ext.max_threads() > 1:
        assert 1 in sizes and max(sizes) > 1
    for a, b in zip(full, adaptive, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].logprobs == b.outputs[0].logprobs
        assert np.array_equal(a.outputs[0].routed_experts, b.outputs[0].routed_experts)


@pytestmark_kernels
def test_engine_prefill_runs_on_the_team_while_the_governor_holds_solo(wide_moe) -> None:
    llm = _run(wide_moe, kernel_team="adaptive")
    sizes: list[int] = []

    def set_threads(n: int) -> None:
        sizes.append(n)
        ext.lib().set_threads(n)

    gov = TeamGovernor(set_threads, lambda: 2, min_interval=4096, max_interval=4096)
    gov.solo = True  # as after a batch-1 decode stretch where one thread was as fast as two
    llm.engine.runner.team = gov
    sp = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
    llm.generate([{"prompt_token_ids": list(range(3, 3 + MAX_LINEAR_ROWS + 1))}], sp, use_tqdm=False)
    assert sizes == []  # a 33-token prefill step: the configured team, never set to one thread
    llm.generate([{"prompt_token_ids": list(range(3, 3 + MAX_LINEAR_ROWS))}], sp, use_tqdm=False)
    assert sizes[0] == 1  # a step of 32 tokens takes the held mode
    ext.lib().set_threads(ext.max_threads())


@pytestmark_kernels
@pytest.mark.parametrize("clock", ["wall", "cpu"])
def test_step_timers_name_every_phase_and_change_nothing(wide_moe, clock) -> None:
    rng = np.random.default_rng(6)
    prompts = [rng.integers(3, 500, n).tolist() for n in (9, 30)]
    plain = _gen(_run(wide_moe), prompts)
    llm = _run(wide_moe, step_timers=clock)
    timed = _gen(llm, prompts)
    for a, b in zip(plain, timed, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].logprobs == b.outputs[0].logprobs
    recs = llm.engine.step_timers.records
    dense = any(not hasattr(layer.mlp, "router") for layer in llm.engine.model.layers)
    assert recs[0].prefill and recs[0].batch == 2 and recs[0].context_lens == (9, 30)
    decode = [r for r in recs if not r.prefill]
    assert len(decode) == 11  # 12 tokens: the first from the prefill step
    for j, r in enumerate(decode):
        assert r.batch == 2 and r.context_lens == (10 + j, 31 + j)
        assert set(r.segments) == set(SEGMENTS) and set(r.kernel) == set(KERNEL_PHASES)
        for phase in ("norm", "qkv", "rope_kv", "attention", "o_proj", "router", "routing", "experts"):
            assert r.kernel[phase] > 0, phase  # a MoE layer routes and runs its experts in the call
        assert (r.kernel["mlp"] > 0) == dense
        for seg in ("layers", "lm_head", "sample", "step"):
            assert r.segments[seg] > 0, seg
        assert r.segments["routing"] == r.segments["experts"] == 0
        assert sum(r.kernel.values()) <= r.segments["layers"]
        assert 0 <= r.segments["step"] - sum(v for k, v in r.segments.items() if k != "step") == pytest.approx(
            r.python)
