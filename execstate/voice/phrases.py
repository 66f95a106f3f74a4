"""Reply text -> pieces to synthesise, as it streams (pure Python).

A reply arrives as small text deltas (a few tokens per front step). ``PhraseChunker.push(delta)``
returns the pieces ready to speak: the text up to the last whitespace (whole words), once it holds
``min_words`` words or a clause ends in it (``,;:.?!``); ``end()`` returns the rest. Each piece is
``(start, text)``: ``start`` is its first character's offset in the reply's text, so word
positions inside a piece map back to the reply (truncation by what was played). Pieces
concatenate to the reply's text: ``"".join`` of every piece's text equals every delta joined.
``first_words`` (1) is the threshold for the first piece, so the first audio waits for one word.
"""

from __future__ import annotations

import re

_CLAUSE = re.compile(r"[,;:.?!]\s")


class PhraseChunker:
    def __init__(self, min_words: int = 3, first_words: int = 1) -> None:
        self.min_words, self.first_words = min_words, first_words
        self._buf = ""
        self._start = 0  # reply offset of _buf[0]
        self._pieces = 0

    def push(self, delta: str) -> list[tuple[int, str]]:
        self._buf += delta
        cut = max(self._buf.rfind(" "), self._buf.rfind("\n"), self._buf.rfind("\t"))
        if cut <= 0:
            return []
        head = self._buf[:cut]
        need = self.first_words if self._pieces == 0 else self.min_words
        if len(head.split()) < need and not _CLAUSE.search(self._buf[:cut + 1]):
            return []
        return [self._take(cut)]

    def end(self) -> list[tuple[int, str]]:
        return [self._take(len(self._buf))] if self._buf else []

    def _take(self, n: int) -> tuple[int, str]:
        piece = (self._start, self._buf[:n])
        self._buf, self._start = self._buf[n:], self._start + n
        self._pieces += 1
        return piece
