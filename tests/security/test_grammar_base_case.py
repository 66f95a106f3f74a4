"""A grammar with no base case (``start: "a" start``: no finite string matches it) is refused when it
is compiled, as a 400 that names the grammar's rules, before any engine request exists; before, it
compiled, generated, and failed mid-generation with a 500 carrying llguidance's parser state
(``Too many items (limit 50000) ... {"rows": 25003 ...``).

Grammars with a base case, however deep their recursion, still compile and generate.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import llguidance as llg
import pytest
from security_helpers import http, server

from execstate.engine.grammar.compiler import GrammarCompiler
from execstate.engine.grammar.matcher import GrammarMatcher
from execstate.engine.grammar.productive import unproductive_rules
from execstate.engine.grammar.spec import StructuredOutputsParams
from execstate.engine.tokenizer import Tokenizer
from execstate.model.random_tokenizer import write_tokenizer

NO_BASE_CASE = [
    ('start: "a" start', ["start"]),
    ('root ::= "a" root', ["start"]),  # GBNF, converted to Lark first (its root becomes start)
    ('start: x\nx: "a" y\ny: "b" x\n', ["x", "y"]),
    ('start: ("a" | "b") start "c"', ["start"]),
    ('start: x+\nx: "(" x ")"', ["x"]),
]
WITH_BASE_CASE = [
    'start: "a" start | "b"',
    'start: x\nx: "(" x ")" | "()"\n',
    'start: item*\nitem: "a" item',  # item never ends, but start is the empty string: matchable
    'start: [x] "z"\nx: "a" x',
    'start: %json {"type": "object"}',
    'root ::= "a" root | "b"',
]


@contextmanager
def tiny_compiler() -> Iterator[tuple[Tokenizer, GrammarCompiler]]:
    with tempfile.TemporaryDirectory() as d:
        write_tokenizer(Path(d))
        tok = Tokenizer(d)
        yield tok, GrammarCompiler(tok.backend, tok.vocab_size, [2])


@pytest.mark.parametrize(("grammar", "rules"), NO_BASE_CASE)
def test_no_base_case_is_a_400_naming_the_rules(model_dir, grammar, rules):
    with server(model_dir) as s:
        r = http("POST", f"{s.url}/v1/completions", body={
            "model": "m", "prompt": [5, 6, 7], "max_tokens": 64, "structured_outputs": {"grammar": grammar}})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == "structured_outputs", err
        msg = err["message"]
        assert "grammar" in msg and all(f"'{rule}'" in msg for rule in rules), msg
        assert "Too many items" not in msg and "rows" not in msg, msg
        assert s.engine.call(lambda e: (len(e.requests), e.block_pool.num_used)) == (0, 0)


@pytest.mark.parametrize("grammar", WITH_BASE_CASE)
def test_grammars_with_a_base_case_compile(grammar):
    with tiny_compiler() as (_, compiler):
        compiled = compiler.compile(StructuredOutputsParams.from_dict({"grammar": grammar}))
        assert compiled.matcher().num_tokens == 0


def test_base_case_grammar_generates_over_http(model_dir):
    with server(model_dir) as s:
        r = http("POST", f"{s.url}/v1/completions", body={
            "model": "m", "prompt": [5, 6, 7], "max_tokens": 12, "temperature": 0,
            "structured_outputs": {"grammar": 'start: "a" start | "b"'}})
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["text"]
        assert set(text) <= {"a", "b"} and (text.endswith("b") or set(text) == {"a"}), text


def test_the_analysis_gives_no_verdict_on_what_it_cannot_read():
    assert unproductive_rules('start: "a" start') == ["start"]
    assert unproductive_rules('start: "a" start | "b"') == []
    assert unproductive_rules("start: @@@") is None  # not Lark it knows: llguidance decides
    assert unproductive_rules('other: "a"') is None  # no start rule: llguidance's error
    deep = "start: " + "(" * 5000 + '"a"' + ")" * 5000
    assert unproductive_rules(deep) is None  # deeper than the recursion limit: no verdict, no crash


def test_a_matcher_error_never_carries_the_parser_state():
    with tiny_compiler() as (tok, compiler):
        # the grammar the check refuses, built behind its back: llguidance fails it while matching
        grammar = llg.LLMatcher.grammar_from_lark('start: "a" start')
        ll = llg.LLMatcher(compiler.ll_tokenizer, grammar, log_level=0, limits=compiler.limits())
        m = GrammarMatcher(StructuredOutputsParams.from_dict({"grammar": 'start: "a" start'}), ll)
        a = tok.encode("a", add_special_tokens=False)[0]
        for _ in range(8):
            if not m.accept(a):
                break
            ll.compute_bitmask()
        assert m.error is not None, "the matcher did not fail"
        assert "<state>" not in m.error and "rows" not in m.error and "\n" not in m.error, m.error
