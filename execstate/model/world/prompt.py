"""Prompt text -> word ids for the prompt encoder (pure Python; a hashed bag of words).

Words are the lower-cased runs of letters and digits; each distinct word (first
``max_words``, in order) maps to a bucket in ``[1, buckets)`` by sha256 under a domain tag (never
Python ``hash()``: the same prompt gives the same ids on every process). Id 0 is the null word,
always first, so an empty prompt is one token and the cross-attention always has a key.
"""

from __future__ import annotations

import hashlib
import re

_DOMAIN = b"execstate/v1/world-word\x00"
_WORD = re.compile(r"[a-z0-9]+")


def word_ids(prompt: str, buckets: int, max_words: int) -> list[int]:
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be str, got {type(prompt).__name__}")
    ids = [0]
    seen: set[str] = set()
    for word in _WORD.findall(prompt.lower()):
        if word in seen:
            continue
        seen.add(word)
        digest = hashlib.sha256(_DOMAIN + word.encode()).digest()
        ids.append(1 + int.from_bytes(digest[:8], "big") % (buckets - 1))
        if len(ids) > max_words:
            break
    return ids
