"""Incremental detokenisation, tail-only stop strings and output kinds, without a model.

Requests are driven token by token through the engine's own per-token path
(``on_new_token`` then ``build_output``), on the tiny byte-level test tokenizer and, when
it is prepared, on SmolLM2's. Oracles: ``tokenizer.decode(all ids)`` (the full decode the
engine used to redo every step) and, for stop strings, the old whole-text rule: after
each token, the first stop string (list order) found anywhere in the text decoded so far
stops the request, and the text is cut at its first occurrence.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execstate.engine.detokenizer import IncrementalDetokenizer
from execstate.engine.output_builder import build_output, on_new_token
from execstate.engine.outputs import RequestOutput
from execstate.engine.request import Request
from execstate.engine.sampling_params import RequestOutputKind, SamplingParams
from execstate.engine.tokenizer import Tokenizer
from execstate.model.random_tokenizer import VOCAB, write_tokenizer
from execstate.model.registry import is_prepared
from execstate.paths import model_dir

CUMULATIVE, DELTA, FINAL_ONLY = RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY
FFFD = "\ufffd"
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Tokenizer:
    return Tokenizer(write_tokenizer(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def smol() -> Tokenizer:
    if not is_prepared("smollm2-135m"):
        pytest.skip("smollm2-135m is not prepared (execstate models prepare smollm2-135m builds it in ~1 min)")
    return Tokenizer(model_dir("smollm2-135m"))


@pytest.fixture(scope="module", params=["tiny", "smol"])
def tok(request) -> Tokenizer:
    return request.getfixturevalue(request.param)


def ids_for(tok: Tokenizer) -> st.SearchStrategy[list[int]]:
    """Random ids, weighted to the low (byte) ids where characters split, plus a few
    ids outside the vocabulary (decoded as nothing)."""
    vocab = tok.vocab_size
    one = st.one_of(st.integers(0, min(vocab, VOCAB) - 1), st.integers(0, vocab + 3))
    return st.lists(one, min_size=1, max_size=40)


def drive(
    tok: Tokenizer | None, ids: list[int], kind: RequestOutputKind = CUMULATIVE, **kw
) -> tuple[Request, list[RequestOutput]]:
    """Feed ``ids`` as sampled tokens until the request stops; every output built."""
    kw.setdefault("max_tokens", len(ids))
    params = SamplingParams(temperature=0.0, ignore_eos=True, output_kind=kind, **kw)
    req = Request("r", [1, 2, 3], params, max_model_len=100_000)
    outs = []
    for i, t in enumerate(ids):
        req.output_token_ids.append(t)
        req.output.logprobs.append(-0.5 - i)
        req.output.top_logprobs.append([(t, -0.5 - i), (t + 1, -9.0)])
        status = on_new_token(req, {2}, tok)
        if status is not None:
            req.status = status
        if status is not None or kind is not FINAL_ONLY:
            outs.append(build_output(req, tok, return_routes=False))
        if status is not None:
            break
    return req, outs


def old_rule(tok: Tokenizer, ids: list[int], stops: list[str]) -> tuple[str, str | None, int]:
    """(text, stop_reason, tokens used) by re-decoding everything after each token."""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k])
        for s in stops:
            if s in text:
                return text[: text.find(s)], s, k
    return tok.decode(ids), None, len(ids)


# -- detokenisation -------------------------------------------------------------------------


@SETTINGS
@given(data=st.data(), skip=st.booleans())
def test_incremental_text_equals_full_decode_and_is_never_retracted(tok, data, skip):
    ids = data.draw(ids_for(tok))
    full = tok.decode(ids, skip_special_tokens=skip)
    det = IncrementalDetokenizer(skip_special_tokens=skip)
    streamed = ""
    for t in ids:
        det.add_token(tok, t)
        streamed += det.take_delta(finished=False)
        assert full.startswith(streamed)  # nothing sent is ever taken back or changed
    det.finish(tok)
    streamed += det.take_delta(finished=True)
    assert streamed == full == det.text(finished=True)


@pytest.mark.parametrize("text", ["日本語 €uro 😀!", "héllo wörld — ça va? 👍🏽"])
def test_multibyte_characters_split_across_tokens_never_stream_fffd(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    _, outs = drive(tok, ids, DELTA)
    pieces = [o.outputs[0].text for o in outs]
    assert "".join(pieces) == text == tok.decode(ids)
    assert all(FFFD not in p for p in pieces)
    if tok.vocab_size == VOCAB:  # byte-level test tokenizer: every multi-byte character is split
        assert pieces.count("") >= 10


def test_a_trailing_incomplete_character_is_flushed_as_fffd_at_the_end(tiny):
    euro = tiny.encode("€", add_special_tokens=False)
    assert len(euro) == 3
    ids = tiny.encode("ab", add_special_tokens=False) + euro[:2]
    _, outs = drive(tiny, ids, DELTA)
    assert [o.outputs[0].text for o in outs][-1] == FFFD  # only the finishing output
    assert "".join(o.outputs[0].text for o in outs) == tiny.decode(ids) == "ab" + FFFD


def test_special_tokens_follow_skip_special_tokens(tiny):
    ids = [1] + tiny.encode("hi", add_special_tokens=False) + [0, 2]
    _, shown = drive(tiny, ids, skip_special_tokens=False)
    _, skipped = drive(tiny, ids)
    assert shown[-1].outputs[0].text == "<s>hi<pad></s>" == tiny.decode(ids, skip_special_tokens=False)
    assert skipped[-1].outputs[0].text == "hi"


def test_model_without_tokenizer_has_tokens_and_logprobs_but_no_text():
    req, outs = drive(None, [5, 6, 7], DELTA, logprobs=1, stop=["x"])
    assert [o.outputs[0].text for o in outs] == ["", "", ""]
    assert sum((o.outputs[0].token_ids for o in outs), []) == [5, 6, 7]
    assert outs[-1].outputs[0].finish_reason == "length"
    assert outs[0].outputs[0].logprobs == [req.output.logprob_entries[0]]
    assert req.output.logprob_entries[0][5].decoded_token is None


# -- stop strings -----------------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_tail_only_stop_strings_match_the_whole_text_rule(tok, data):
    ids = data.draw(ids_for(tok))
    full = tok.decode(ids)
    clean = full.replace(FFFD, "")  # a stop string never ends in a character still incomplete
    substrings = st.builds(lambda i, n: clean[i : i + n], st.integers(0, max(len(clean) - 1, 0)), st.integers(1, 6))
    stop = st.one_of(substrings, st.text(alphabet="ab éé€😀", min_size=1, max_size=3)).filter(bool)
    stops = data.draw(st.lists(stop, min_size=1, max_size=3))
    text, reason, used = old_rule(tok, ids, stops)

    req, cum = drive(tok, ids, CUMULATIVE, stop=stops)
    final = cum[-1].outputs[0]
    assert (final.text, final.stop_reason, len(final.token_ids)) == (text, reason, used)
    assert final.finish_reason == ("stop" if reason is not None else "length")
    assert all(text.startswith(o.outputs[0].text) for o in cum)  # never shows what is cut later

    _, deltas = drive(tok, ids, DELTA, stop=stops)
    sent = ""
    for o in deltas:
        sent += o.outputs[0].text
        assert text.startswith(sent)  # a possible stop-string start is held back until known
    assert sent == text
    assert sum((o.outputs[0].token_ids for o in deltas), []) == ids[:used]


def test_stop_string_split_across_tokens(tiny):
    ids = tiny.encode("hello world, goodbye", add_special_tokens=False)
    pieces = [tiny.decode([t]) for t in ids]
    assert pieces[3:5] == ["o", " w"]  # "o w" spans two tokens
    req, outs = drive(tiny, ids, DELTA, stop=["o w"])
    assert len(req.output_token_ids) == 5 and req.stop_reason == "o w"
    sent = [o.outputs[0].text for o in outs]
    assert "".join(sent) == "hell" and outs[-1].outputs[0].finish_reason == "stop"
    assert "o" not in "".join(sent[:4])  # held back while it could start "o w"


def test_stop_string_in_the_middle_of_a_chunk_cuts_the_rest_of_it(tiny):
    ids = tiny.encode("the cat sat on the mat", add_special_tokens=False)
    assert tiny.decode([ids[3]]) == "at"
    req, outs = drive(tiny, ids, CUMULATIVE, stop=["zz", "a"])
    final = outs[-1].outputs[0]
    assert (final.text, final.stop_reason, len(final.token_ids)) == ("the c", "a", 4)


def test_stop_strings_count_from_min_tokens_on(tiny):
    ids = [tiny.token_to_id(c) for c in "abcabcabc"]  # one character per token
    # "ab" lies wholly in the first two tokens, before the min_tokens-th: not a stop there
    req, outs = drive(tiny, ids, CUMULATIVE, stop=["ab"], min_tokens=3)
    assert outs[-1].outputs[0].text == "abc" and req.stop_reason == "ab" and len(req.output_token_ids) == 5
    # a stop string that ends in the min_tokens-th token but starts before it does stop
    req, outs = drive(tiny, ids, CUMULATIVE, stop=["bc"], min_tokens=3)
    assert outs[-1].outputs[0].text == "a" and len(req.output_token_ids) == 3


# -- output kinds ---------------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_delta_outputs_concatenate_to_the_cumulative_final(tiny, data):
    ids = data.draw(ids_for(tiny))
    kw = dict(
        logprobs=1, stop=data.draw(st.one_of(st.none(), st.lists(st.text("ab c", min_size=1, max_size=3), max_size=2)))
    )
    _, cum = drive(tiny, ids, CUMULATIVE, **kw)
    _, deltas = drive(tiny, ids, DELTA, **kw)
    _, only = drive(tiny, ids, FINAL_ONLY, **kw)
    final, last = cum[-1].outputs[0], deltas[-1].outputs[0]
    assert len(only) == 1 and only[0].finished and only[0].outputs[0] == final
    assert len(deltas) == len(cum) and [o.finished for o in deltas] == [o.finished for o in cum]
    assert "".join(o.outputs[0].text for o in deltas) == final.text
    assert sum((o.outputs[0].token_ids for o in deltas), []) == final.token_ids
    assert sum((o.outputs[0].logprobs for o in deltas), []) == final.logprobs
    assert all(len(o.outputs[0].token_ids) == 1 for o in deltas)
    assert (last.finish_reason, last.stop_reason, last.cumulative_logprob) == (
        final.finish_reason, final.stop_reason, final.cumulative_logprob)
    assert all(o.outputs[0].finish_reason is None for o in deltas[:-1])


def test_logprob_entries_are_built_once_and_shared(tiny):
    ids = tiny.encode("the cat", add_special_tokens=False)
    req, cum = drive(tiny, ids, CUMULATIVE, logprobs=1)
    first = cum[0].outputs[0].logprobs[0]
    assert all(o.outputs[0].logprobs[0] is first for o in cum)  # never rebuilt
    assert first == {ids[0]: first[ids[0]], ids[0] + 1: first[ids[0] + 1]}
    assert (first[ids[0]].logprob, first[ids[0]].rank, first[ids[0]].decoded_token) == (-0.5, 1, "th")
    assert cum[-1].outputs[0].cumulative_logprob == sum(-0.5 - i for i in range(len(ids)))
    # an unfinished cumulative output is a snapshot: later tokens do not change it
    assert len(cum[0].outputs[0].token_ids) == 1 and len(cum[0].outputs[0].logprobs) == 1


def test_a_stop_string_before_a_split_character_stops_at_its_token(smol):
    """Token 459 decodes to a space and the first byte of a split character: the space is text
    the moment the token arrives (a full decode shows it), so a stop string " " ends the request
    at that token, although the stream still holds the token back for its incomplete character."""
    assert smol.decode([459]) == " " + FFFD and smol.decode([0]) == ""
    assert old_rule(smol, [459, 0], [" "]) == ("", " ", 1)
    for kind in (CUMULATIVE, DELTA):
        req, outs = drive(smol, [459, 0], kind, stop=[" "])
        assert (req.stop_reason, len(req.output_token_ids), outs[-1].outputs[0].text) == (" ", 1, "")
    req, _ = drive(smol, [459, 0], CUMULATIVE, stop=["x"])  # no stop: the whole text at the end
    assert req.output.detok.text(True) == " " + FFFD and req.stop_reason is None
