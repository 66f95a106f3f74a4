"""The structured-output matcher state is session state (docs/contracts.md 6): a constrained output
spans steps; a checkpoint keeps the matcher, a rollback restores it (the same inputs give the same
constrained output), a fork clones it, a migration carries it (its next steps equal those in place)."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import pytest
from migration_helpers import Engines, assert_same_steps
from session_helpers import make_llm, tokens

from execstate import SamplingParams
from execstate.engine.grammar.spec import StructuredOutputsParams
from execstate.session.lm.migration import migrate_session
from execstate.session.runtime.events import SessionEventError

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tag": {"enum": ["ab", "cd", "ef"]}, "ok": {"type": "boolean"}},
          "required": ["n", "tag", "ok"], "additionalProperties": False}
PARAMS = SamplingParams(temperature=1.0, seed=3, max_tokens=6, structured_outputs=StructuredOutputsParams(json=SCHEMA))
PROMPT = tokens(40, 12)


def _text(llm, ids: list[int]) -> str:
    return llm.get_tokenizer().decode(ids)


def _until_done(s, first: list[int] | None) -> list:
    steps = [s.step(first, max_tokens=6)]
    while steps[-1].finish_reason == "length":
        steps.append(s.step(max_tokens=6))
    return steps


def test_a_constrained_output_spans_steps_and_rollback_reproduces_it(moe_dir):
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=PARAMS)
    first = s.step(PROMPT)
    assert first.finish_reason == "length" and len(first.token_ids) == 6
    cp = s.checkpoint()
    matcher_at_cp = llm.sessions.manager.get(s.session_id).state.grammar.token_ids[:]
    rest = _until_done(s, None)
    assert rest[-1].finish_reason == "stop"
    out = first.token_ids + [t for r in rest for t in r.token_ids]
    jsonschema.validate(json.loads(_text(llm, out)), SCHEMA)
    s.rollback(cp)
    assert llm.sessions.manager.get(s.session_id).state.grammar.token_ids == matcher_at_cp == first.token_ids
    again = _until_done(s, None)
    assert [r.token_ids for r in again] == [r.token_ids for r in rest]  # same inputs, same constrained output
    fork = s.fork(cp)
    forked = _until_done(fork, None)
    assert [r.token_ids for r in forked] == [r.token_ids for r in rest]
    # the fork's matcher is its own: stepping it did not move the original's
    assert llm.sessions.manager.get(s.session_id).state.grammar.stopped
    fork.close()
    s.close()


def test_an_output_completed_on_the_length_limits_token_stops(moe_dir):
    """A grammar completed by the last token max_tokens allows finishes ``stop`` (as EOS would), so a
    session's next step does not start a second document: on every kernel set, wherever the limit falls."""
    llm = make_llm(moe_dir)
    full = llm.generate({"prompt_token_ids": PROMPT}, replace(PARAMS, max_tokens=64))[0].outputs[0]
    assert full.finish_reason == "stop"
    n = len(full.token_ids)
    exact = llm.generate({"prompt_token_ids": PROMPT}, replace(PARAMS, max_tokens=n))[0].outputs[0]
    assert exact.token_ids == full.token_ids and exact.finish_reason == "stop"
    jsonschema.validate(json.loads(exact.text), SCHEMA)
    short = llm.generate({"prompt_token_ids": PROMPT}, replace(PARAMS, max_tokens=n - 1))[0].outputs[0]
    assert short.token_ids == full.token_ids[:-1] and short.finish_reason == "length"


def test_a_completed_output_restarts_and_a_new_constraint_replaces_the_matcher(moe_dir):
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=replace(PARAMS, max_tokens=64))
    done = s.step(PROMPT)
    assert done.finish_reason == "stop"
    jsonschema.validate(json.loads(done.text), SCHEMA)
    nxt = s.step(tokens(41, 3))  # the same constraint, after a complete output: a new document
    jsonschema.validate(json.loads(nxt.text), SCHEMA)
    s.submit_event(s.info().last_event_id + 1 if s.info().last_event_id is not None else 100, "sampling",
                   {"structured_outputs": {"choice": ["yes", "no"]}})
    assert s.step(tokens(42, 3)).text in ("yes", "no")
    with pytest.raises(SessionEventError, match="exactly one"):
        s.submit_event(1000, "sampling", {"structured_outputs": {"regex": "a", "choice": ["b"]}})
    s.close()


@pytest.fixture()
def engines(moe_dir):
    built = Engines(moe_dir)
    yield built
    built.close()


def test_migration_carries_the_matcher(engines, moe_dir):
    ref = make_llm(moe_dir).open_session(sampling_params=PARAMS)
    ref_first = ref.step(PROMPT)
    ref_rest = _until_done(ref, None)
    a, b = engines(), engines()
    s = a.open_session(sampling_params=PARAMS, session_id="gram-1")
    assert s.step(PROMPT).token_ids == ref_first.token_ids
    m = migrate_session(s, b)
    s2 = m.session
    g = b.sessions.manager.get("gram-1").state.grammar
    assert g is not None and g.token_ids == ref_first.token_ids
    got = _until_done(s2, None)
    assert_same_steps(got, ref_rest)
    text = _text(b, ref_first.token_ids + [t for r in got for t in r.token_ids])
    jsonschema.validate(json.loads(text), SCHEMA)
    s2.close()
