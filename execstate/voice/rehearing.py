"""The words of a transcription that re-heard earlier audio, after the part that re-heard it.

A recognizer that transcribes a new utterance together with the utterances just before it (their
audio as context: ``moonshine_asr.py``) gets one text for all of them. :func:`after_context` splits
off the new utterance's own words: the text is cut at the word boundary where its letters so far
are closest (edit distance over letters and digits, case and punctuation ignored) to the text the
context had on its own. Letters, not words, because the context's words are often re-heard split
or joined differently ("Tell me along" re-heard as "Tell me a long story about trains": the cut
is after "long", so the new words are "story about trains").
"""

from __future__ import annotations


def _letters(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum())


def after_context(text: str, context: str) -> str:
    """``text`` without its leading words that re-hear ``context`` (module docstring). Ties go to
    the cut whose letters are nearest the context's count. No cut (the whole text is new) when the
    nearest prefix still differs from the context in more than half its letters (the context was
    not re-heard: "Sure." after "Describe trains for me.") or the context is empty."""
    words = text.split()
    ctx = _letters(context)
    if not ctx or not words:
        return text.strip()
    # row[j]: edit distance between the context's letters so far and the text's first j letters
    letters = _letters(text)
    row = list(range(len(letters) + 1))
    for i, c in enumerate(ctx, 1):
        prev, row[0] = row[0], i
        for j in range(1, len(letters) + 1):
            cur = min(row[j] + 1, row[j - 1] + 1, prev + (c != letters[j - 1]))
            prev, row[j] = row[j], cur
    best, cut, at = None, 0, 0
    for k in range(len(words) + 1):  # the cut before words[k], after `at` letters
        key = (row[at], abs(at - len(ctx)))
        if best is None or key < best:
            best, cut = key, k
        if k < len(words):
            at += len(_letters(words[k]))
    if best is None or 2 * best[0] > len(ctx):
        return " ".join(words)
    return " ".join(words[cut:])
