"""Incremental detokenisation, tail-only stop strings and output deltas of one request.

Per-token cost is O(1) in the output length (docs/contracts.md 8): each step decodes only the
new token, searches only the newest characters for stop strings and hands out only the
text not yet handed out. The model is vLLM's ``FastIncrementalDetokenizer``; decoding
uses the ``tokenizers`` library's ``DecodeStream``.

``IncrementalDetokenizer`` (one per request, kept on ``Request.output.detok``) contract:

- ``add_token(tokenizer, id)`` returns the number of characters the token added. While
  the tokens so far end in an incomplete UTF-8 sequence (a character split across
  tokens), they add nothing: no U+FFFD of a split character is ever produced mid-stream.
- ``finish(tokenizer)`` (idempotent) decodes what is still held back at the end of the
  request (an incomplete sequence becomes U+FFFD, as in a full decode). Afterwards the
  text equals ``tokenizer.decode(output ids, skip_special_tokens)``, unless a stop string
  cut it.
- ``find_stop_held_back(tokenizer)``: the same search over the complete characters of ids
  still held back (the text before an incomplete character), without adding them unless a
  stop string is found there.
- ``find_stop(new_chars)`` searches each stop string (in list order) only in the last
  ``new_chars + len(stop) - 1`` characters; on a hit the text is cut where the stop
  string begins and the stop string is returned. Text before the newest ``new_chars``
  was searched when it arrived, so nothing is searched twice and nothing is missed.
- Unfinished outputs hold back the last ``max(len(stop)) - 1`` characters (they may be
  the start of a stop string, which the final text will not contain); ``take_delta``
  hands out each character exactly once, ``text`` the whole text so far (O(length): it
  is what a cumulative output returns). Finished: nothing is held back.

Without a tokenizer (a model without ``tokenizer.json``) the text stays empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenizers import Tokenizer as HFTokenizer
from tokenizers.decoders import DecodeStream

if TYPE_CHECKING:
    from execstate.engine.tokenizer import Tokenizer


class _StreamDecoder:
    """``DecodeStream`` plus the ids it still holds back, so the end can be flushed.

    Mirrors the library's state: ``window`` holds the ids of the last chunk it emitted
    (its decoding prefix), ``pending`` the ids fed since (not yet decodable on their own).
    """

    def __init__(self, skip_special_tokens: bool) -> None:
        self.skip_special_tokens = skip_special_tokens
        self.stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.window: list[int] = []
        self.pending: list[int] = []

    def step(self, tok: HFTokenizer, token_id: int) -> str:
        try:
            text = self.stream.step(tok, token_id)
        except Exception as exc:  # tokenizers raises a bare Exception for this one
            if "Invalid prefix" not in str(exc):
                raise
            # A decoder whose output is not prefix-stable (rare): restart from this token,
            # as vLLM does.
            self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
            self.window, self.pending = [], []
            text = self.stream.step(tok, token_id)
        if text is None:
            self.pending.append(token_id)
            return ""
        self.window = self.pending + [token_id]
        self.pending = []
        return text

    def peek(self, tok: HFTokenizer) -> str:
        """What the held-back ids decode to so far, without the incomplete character(s) at the
        end; changes nothing."""
        return self._pending_text(tok).rstrip("\ufffd")

    def flush(self, tok: HFTokenizer) -> str:
        """What the held-back ids decode to in the context of the last chunk."""
        rest = self._pending_text(tok)
        self.window, self.pending = self.window + self.pending, []
        return rest

    def _pending_text(self, tok: HFTokenizer) -> str:
        """The held-back ids' text in the context of the last chunk ("" when none are held)."""
        if not self.pending:
            return ""
        skip = self.skip_special_tokens
        prefix = tok.decode(self.window, skip_special_tokens=skip)
        full = tok.decode(self.window + self.pending, skip_special_tokens=skip)
        return full[len(prefix) :] if full.startswith(prefix) else tok.decode(self.pending, skip_special_tokens=skip)


class IncrementalDetokenizer:
    """One request's output text: decoded token by token, cut at a stop string."""

    def __init__(self, skip_special_tokens: bool = True, stop: list[str] | None = None) -> None:
        self._decoder = _StreamDecoder(skip_special_tokens)
        self.stop = list(stop or [])
        # Characters an unfinished output holds back (a possible stop-string prefix).
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self._chunks: list[str] = []
        self.num_chars = 0
        self.num_sent = 0  # characters handed out by take_delta
        self.finished = False

    def add_token(self, tokenizer: Tokenizer | None, token_id: int) -> int:
        if tokenizer is None or self.finished:
            return 0
        return self._append(self._decoder.step(tokenizer.backend, token_id))

    def finish(self, tokenizer: Tokenizer | None) -> int:
        """Flush the held-back end (once); returns the characters it added."""
        if self.finished:
            return 0
        self.finished = True
        return self._append(self._decoder.flush(tokenizer.backend)) if tokenizer is not None else 0

    def find_stop(self, new_chars: int) -> str | None:
        """The first stop string (list order) that ends in the newest ``new_chars``
        characters; the text is cut where it begins."""
        if not self.stop or new_chars <= 0:
            return None
        tail = self._suffix(new_chars + self.holdback)
        base = self.num_chars - len(tail)
        for s in self.stop:
            at = tail.find(s, max(0, len(tail) - new_chars - len(s) + 1))
            if at >= 0:
                self._truncate(base + at)
                self.finished = True  # the text ends here: nothing held back is added later
                return s
        return None

    def find_stop_held_back(self, tokenizer: Tokenizer | None) -> str | None:
        """A stop string that ends in the complete characters of the ids still held back for an
        incomplete character (a token that decodes to ``" \ufffd"`` holds back its space too):
        on a hit the held-back text is added and cut as :meth:`find_stop` does, so the request
        stops at the token that completed the stop string, as a full decode after each token
        would see it."""
        if not self.stop or tokenizer is None or self.finished:
            return None
        peek = self._decoder.peek(tokenizer.backend)
        if not peek or not any(s in self._suffix(self.holdback) + peek for s in self.stop):
            return None
        return self.find_stop(self.finish(tokenizer))

    def text(self, finished: bool) -> str:
        """The whole text so far (less the hold-back while unfinished)."""
        whole = "".join(self._chunks)
        self._chunks = [whole] if whole else []
        return whole if finished else whole[: max(0, self.num_chars - self.holdback)]

    def take_delta(self, finished: bool) -> str:
        """Text not handed out before (less the hold-back while unfinished)."""
        end = self.num_chars if finished else self.num_chars - self.holdback
        if end <= self.num_sent:
            return ""
        unsent = self._suffix(self.num_chars - self.num_sent)
        self.num_sent = end
        return unsent[: len(unsent) - (self.num_chars - end)]

    # -- text storage: a list of chunks, appended in O(1), read from the end ---------------
    def _append(self, chunk: str) -> int:
        if chunk:
            self._chunks.append(chunk)
            self.num_chars += len(chunk)
        return len(chunk)

    def _suffix(self, n: int) -> str:
        """The last ``n`` characters (touches only the chunks that hold them)."""
        parts: list[str] = []
        need = n
        for chunk in reversed(self._chunks):
            if need <= 0:
                break
            part = chunk if len(chunk) <= need else chunk[len(chunk) - need :]
            parts.append(part)
            need -= len(part)
        return "".join(reversed(parts))

    def _truncate(self, pos: int) -> None:
        drop = self.num_chars - pos
        while drop > 0:
            last = self._chunks[-1]
            if len(last) <= drop:
                self._chunks.pop()
                drop -= len(last)
            else:
                self._chunks[-1] = last[: len(last) - drop]
                drop = 0
        self.num_chars = pos
