"""Weight updates (engine/weight_update.py): in place, versioned, abort or drain, and no
old unit is ever hit afterwards. References are fresh engines on the old / new weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from execstate import LLM
from execstate.engine.sampling_params import SamplingParams
from execstate.model.loader import load_hf_state_dict
from execstate.model.weights_digest import model_digest

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def llm(path: Path, **kw) -> LLM:
    return LLM(str(path), enable_return_routed_experts=True, block_size=4, max_model_len=128, **kw)


def prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def gen(engine: LLM, ids: list[int], params: SamplingParams = GREEDY):
    return engine.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0]


def same(a, b) -> None:
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    np.testing.assert_array_equal(a.outputs[0].routed_experts, b.outputs[0].routed_experts)


@pytest.fixture(scope="module")
def new_sd(moe_dir_other_weights) -> dict:
    return load_hf_state_dict(moe_dir_other_weights)


@pytest.fixture(scope="module")
def cold_new(moe_dir_other_weights) -> LLM:
    return llm(moe_dir_other_weights)


@pytest.fixture(scope="module")
def cold_old(moe_dir) -> LLM:
    return llm(moe_dir)


def _ptrs(e: LLM) -> dict[str, int]:
    return {n: p.data_ptr() for n, p in e.engine.model.named_parameters()}


@pytest.mark.parametrize("source", ["state_dict", "path"])
@pytest.mark.parametrize("version", [None, "step-1"])
def test_update_in_place_and_old_units_never_hit(moe_dir, moe_dir_other_weights, new_sd, cold_new, source, version):
    e = llm(moe_dir)
    ids = prompt(1, 40)
    before = gen(e, ids)
    assert gen(e, ids).num_cached_tokens == 36  # the prompt is cached under the old weights
    ptrs, v0 = _ptrs(e), e.weights_version
    aborted = e.update_weights(new_sd if source == "state_dict" else moe_dir_other_weights, weights_version=version)
    assert aborted == []
    assert _ptrs(e) == ptrs  # copied in place: no parameter was reallocated
    if version is None:  # hashed: the same digest a fresh load of the new weights gets
        assert e.weights_version == cold_new.weights_version == model_digest(cold_new.engine.model) != v0
    else:
        assert e.weights_version == "user:step-1"
    after = gen(e, ids)
    assert after.num_cached_tokens == 0 and after.prompt_token_sources["local_cache"] == 0
    same(after, gen(cold_new, ids))
    assert not np.array_equal(after.outputs[0].routed_experts, before.outputs[0].routed_experts)
    assert gen(e, ids).num_cached_tokens == 36  # new units are cached again
    e.engine.check_integrity()


def test_abort_policy_aborts_running_and_waiting(moe_dir, new_sd, cold_new):
    e = llm(moe_dir, max_num_seqs=1)
    eng = e.engine
    eng.add_request({"prompt_token_ids": prompt(2, 20)}, GREEDY, request_id="running")
    eng.add_request({"prompt_token_ids": prompt(3, 20)}, GREEDY, request_id="waiting")
    eng.step()
    assert [r.request_id for r in eng.scheduler.running] == ["running"]
    outs = e.update_weights(new_sd, weights_version="v2", policy="abort")
    assert sorted(o.request_id for o in outs) == ["running", "waiting"]
    assert all(o.finished and o.outputs[0].finish_reason == "abort" for o in outs)
    assert not eng.has_unfinished_requests() and eng.block_pool.num_used == 0
    same(gen(e, prompt(2, 20)), gen(cold_new, prompt(2, 20)))
    eng.check_integrity()


def test_drain_finishes_in_flight_on_old_weights(moe_dir, new_sd, cold_old, cold_new):
    e = llm(moe_dir, max_num_seqs=2)
    eng = e.engine
    ids = [prompt(10 + i, 18 + i) for i in range(3)]
    for i, p in enumerate(ids):  # two run, one waits for a slot
        eng.add_request({"prompt_token_ids": p}, GREEDY, request_id=f"r{i}")
    eng.step()
    eng.step()
    outs = e.update_weights(new_sd, weights_version="v2", policy="drain")
    assert sorted(o.request_id for o in outs) == ["r0", "r1", "r2"]
    for o in sorted(outs, key=lambda o: o.request_id):
        assert o.finished and o.outputs[0].finish_reason == "length"
        same(o, gen(cold_old, o.prompt_token_ids))  # entirely on the old weights
    assert e.weights_version == "user:v2"
    after = gen(e, ids[0])
    assert after.num_cached_tokens == 0  # the drained requests' units are old units
    same(after, gen(cold_new, ids[0]))
    eng.check_integrity()
    assert eng.block_pool.num_used == 0


def test_drain_holds_newer_requests_until_the_switch(moe_dir, new_sd, cold_old, cold_new):
    e = llm(moe_dir)
    eng = e.engine
    old_ids, new_ids = prompt(20, 24), prompt(21, 24)
    eng.add_request({"prompt_token_ids": old_ids}, GREEDY, request_id="old")
    eng.step()
    update = eng.begin_weight_update(new_sd, "v2", policy="drain")
    assert not update.done
    eng.add_request({"prompt_token_ids": new_ids}, GREEDY, request_id="new")
    finals = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.request_id == "new":
                assert update.done, "a newer request ran before the switch"
            if out.finished:
                finals[out.request_id] = out
    assert update.done and update.result is not None
    assert (update.result.weights_version, update.result.num_drained, update.result.num_aborted) == ("user:v2", 1, 0)
    same(finals["old"], gen(cold_old, old_ids))
    same(finals["new"], gen(cold_new, new_ids))
    eng.check_integrity()


def test_drain_switches_when_the_drained_requests_are_aborted(moe_dir, new_sd):
    e = llm(moe_dir)
    eng = e.engine
    eng.add_request({"prompt_token_ids": prompt(30, 20)}, GREEDY, request_id="a")
    eng.step()
    update = eng.begin_weight_update(new_sd, "v2", policy="drain")
    assert not update.done and eng.needs_polling
    assert eng.abort_request("a").outputs[0].finish_reason == "abort"
    assert update.done and e.weights_version == "user:v2" and not eng.needs_polling


def test_drain_with_nothing_in_flight_switches_at_once(moe_dir, new_sd):
    e = llm(moe_dir)
    update = e.engine.begin_weight_update(new_sd, policy="drain")
    assert update.done and e.engine.weight_update is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weights_version": ""}, "weights_version"),
        ({"weights_version": "x" * 257}, "weights_version"),
        ({"weights_version": 7}, "weights_version"),
        ({"weights_version": "bad\ud800"}, "weights_version"),
        ({"policy": "later"}, "policy"),
        ({"weights_version": "v1", "broken": True}, r"model\.norm\.weight"),
    ],
)
def test_bad_update_changes_nothing(moe_dir, new_sd, cold_old, kwargs, match):
    e = llm(moe_dir)
    eng = e.engine
    ids = prompt(40, 20)
    eng.add_request({"prompt_token_ids": ids}, GREEDY, request_id="inflight")
    eng.step()
    sd = dict(new_sd)
    if kwargs.pop("broken", False):
        sd["model.norm.weight"] = sd["model.norm.weight"][:-1]
    ptrs, version = _ptrs(e), e.weights_version
    with pytest.raises(ValueError, match=match):
        e.update_weights(sd, **kwargs)
    assert (_ptrs(e), e.weights_version, eng.weight_update) == (ptrs, version, None)
    finals = [o for _ in range(20) for o in eng.step() if o.finished]  # the request was not aborted
    assert [o.request_id for o in finals] == ["inflight"]
    same(finals[0], gen(cold_old, ids))  # and the weights are untouched


def test_reused_version_and_concurrent_update_are_refused(moe_dir, new_sd):
    e = llm(moe_dir)
    e.update_weights(new_sd, weights_version="v1")
    with pytest.raises(ValueError, match="already used"):
        e.update_weights(new_sd, weights_version="v1")
    e.engine.add_request({"prompt_token_ids": prompt(50, 10)}, GREEDY)
    e.engine.step()
    e.engine.begin_weight_update(new_sd, "v2", policy="drain")
    with pytest.raises(RuntimeError, match="in progress"):
        e.engine.begin_weight_update(new_sd, "v3", policy="abort")
