"""Constraint -> compiled grammar, once per distinct constraint (llguidance).

Contract: :class:`GrammarCompiler` is built by the engine with its tokenizer (``tokenizers``'), the model's vocabulary
size (the logits' width: a mask has one bit per logit) and the EOS ids. ``compile(spec)`` checks
the bounds (``bounds.py``), builds llguidance's grammar (JSON Schema, regex, choice as a Lark
alternation, Lark or EBNF grammar, any JSON object), constructs a pristine matcher under
``GrammarBounds.limits`` and returns a :class:`CompiledGrammar`; every problem is a ``ValueError``
saying what is wrong. Results are cached by the constraint's canonical key (LRU), so a server can
compile in a worker thread with a timeout and the engine's own call is a cache hit. Thread-safe:
the tokenizer is built once under a lock (about 0.25 s for a 49k vocabulary); llguidance drops
the GIL while it compiles. ``CompiledGrammar.matcher()`` gives a fresh :class:`GrammarMatcher`
(a deep copy of the pristine one: the compiled automaton is shared, the parse state is not);
``restore(snapshot)`` a matcher in a :class:`GrammarSnapshot`'s state (the constraint compiled, its
tokens replayed).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import llguidance as llg
from llguidance.gbnf_to_lark import any_to_lark
from tokenizers import Tokenizer as HFTokenizer

from execstate.engine.grammar.bounds import GrammarBounds, check_bounds
from execstate.engine.grammar.matcher import GrammarMatcher, GrammarSnapshot
from execstate.engine.grammar.productive import unproductive_rules
from execstate.engine.grammar.spec import StructuredOutputsParams

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# JSON output as a person writes it, and nothing a small model can loop on (flexible whitespace
# lets it emit newlines forever): ", " between items, ": " after keys, no other whitespace.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class CompiledGrammar:
    """A compiled constraint: its spec and a pristine matcher that is never advanced."""

    def __init__(self, spec: StructuredOutputsParams, pristine: llg.LLMatcher) -> None:
        self.spec = spec
        self._pristine = pristine

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self.spec, self._pristine.deep_copy())


class GrammarCompiler:
    def __init__(self, tokenizer: HFTokenizer, vocab_size: int, eos_token_ids: list[int],
                 bounds: GrammarBounds | None = None, cache_size: int = 128) -> None:
        self.bounds = bounds or GrammarBounds()
        self.vocab_size = vocab_size
        self._tokenizer = tokenizer
        self._eos = sorted(eos_token_ids)
        self._lock = threading.Lock()
        self._ll_tokenizer: llg.LLTokenizer | None = None
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size

    @property
    def ll_tokenizer(self) -> llg.LLTokenizer:
        with self._lock:
            if self._ll_tokenizer is None:
                eos = self._eos if self._eos else None
                self._ll_tokenizer = llg.LLTokenizer(self._tokenizer.to_str(), n_vocab=self.vocab_size,
                                                     eos_token=eos)
            return self._ll_tokenizer

    def limits(self) -> llg.LLParserLimits:
        b = self.bounds
        return llg.LLParserLimits(initial_lexer_fuel=b.initial_lexer_fuel, step_lexer_fuel=b.step_lexer_fuel,
                                  step_max_items=b.step_max_items, max_grammar_size=b.max_grammar_size,
                                  max_lexer_states=b.max_lexer_states)

    def compile(self, spec: StructuredOutputsParams) -> CompiledGrammar:
        key = spec.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        check_bounds(spec, self.bounds)
        grammar = llguidance_grammar(spec)
        pristine = llg.LLMatcher(self.ll_tokenizer, grammar, log_level=0, limits=self.limits())
        if not pristine.is_error():  # the first mask: what fails at once fails here, not in a step
            probe = pristine.deep_copy()
            probe.compute_bitmask()
            if probe.is_error():
                pristine = probe
        if pristine.is_error():
            raise ValueError(f"invalid structured output {spec.kind}: {_short(pristine.get_error())}")
        compiled = CompiledGrammar(spec, pristine)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled


    def restore(self, snapshot: GrammarSnapshot) -> GrammarMatcher:
        """A matcher in ``snapshot``'s state; ValueError if its spec is invalid or a token is refused."""
        m = self.compile(StructuredOutputsParams.from_wire(snapshot.spec)).matcher()
        for t in snapshot.token_ids:
            if not 0 <= t < self.vocab_size or not m.accept(t):
                raise ValueError(f"grammar state: token {t} is not accepted after {m.num_tokens} tokens")
        return m


def llguidance_grammar(spec: StructuredOutputsParams) -> str:
    """llguidance's grammar text for ``spec``; ValueError when it cannot be built."""
    kind, value = spec.kind, spec.value
    try:
        if kind == "json":
            return llg.LLMatcher.grammar_from_json_schema(value, defaults=_JSON_OPTIONS)
        if kind == "json_object":
            return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_JSON_OPTIONS)
        if kind == "regex":
            return llg.LLMatcher.grammar_from_regex(value)
        if kind == "choice":
            return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in value))
        lark = any_to_lark(value)
        grammar = llg.LLMatcher.grammar_from_lark(lark)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"invalid structured output {kind}: {_short(str(exc))}") from None
    except Exception as exc:  # the EBNF converter raises its own error type
        raise ValueError(f"invalid structured output {kind}: {_short(str(exc))}") from None
    endless = unproductive_rules(lark)
    if endless:
        names = ", ".join(f"'{r}'" for r in endless)
        raise ValueError(f"invalid structured output {kind}: no finite string matches it: rule(s) {names} have no "
                         "base case (every alternative refers back to an unfinished rule); give one alternative "
                         "that ends, e.g. 'start: \"a\" start | \"a\"'")
    return grammar


def _short(msg: str) -> str:
    """The engine's message on one line, at most 300 characters (it may quote the whole grammar)."""
    text = " ".join(msg.split())
    return (text[:297] + "...") if len(text) > 300 else (text or "rejected by the grammar engine")
