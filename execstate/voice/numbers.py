"""English number words <-> digits (pure Python): what a recognizer hears, as a tool reads it.

``words_to_digits("what is seventeen times twenty three")`` -> ``"what is 17 times 23"``: maximal
runs of cardinal number words (``zero`` .. ``nineteen``, the tens, ``hundred``, ``thousand``,
``million``, with an optional ``and`` inside: "three hundred and five") become one integer each.
Other words pass unchanged. ``number_words(391)`` -> ``"three hundred ninety one"``. Round trip:
``words_to_digits(number_words(n)) == str(n)`` for 0 <= n < 10**9 (tested).
"""

from __future__ import annotations

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
        "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SMALL = {w: i for i, w in enumerate(ONES)} | {w: 10 * i for i, w in enumerate(TENS) if w}
_SCALES = {"thousand": 1000, "million": 1_000_000}


def number_words(n: int) -> str:
    if n < 0:
        return "minus " + number_words(-n)
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    if n < 1000:
        return ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + number_words(n % 100))
    for word, scale in (("million", 1_000_000), ("thousand", 1000)):
        if n >= scale:
            rest = n % scale
            return number_words(n // scale) + " " + word + ("" if rest == 0 else " " + number_words(rest))
    raise AssertionError(n)


def _parse(words: list[str]) -> int:
    total, group = 0, 0
    for w in words:
        if w in _SMALL:
            group += _SMALL[w]
        elif w == "hundred":
            group = max(group, 1) * 100
        elif w in _SCALES:
            total += max(group, 1) * _SCALES[w]
            group = 0
    return total + group


def _fits(prev: str | None, w: str) -> bool:
    """May ``w`` continue a number whose last word is ``prev``?"""
    if prev is None:
        return w in _SMALL or w == "hundred"
    if w == "and":
        return prev in ("hundred", "thousand", "million")
    if prev in ONES[10:] or (prev in ONES and prev != "zero"):  # "seventeen" / "three" then a scale
        return w in ("hundred", *_SCALES)
    if prev in TENS:
        return w in ONES[1:10] or w in _SCALES
    if prev == "hundred":
        return w in _SMALL or w in _SCALES or w == "and"
    if prev in _SCALES or prev == "and":
        return w in _SMALL
    return False


def words_to_digits(text: str) -> str:
    out: list[str] = []
    run: list[str] = []

    def close() -> None:
        while run and run[-1] == "and":
            tail = run.pop()
            flush_run()
            out.append(tail)
            return
        flush_run()

    def flush_run() -> None:
        if run:
            out.append(str(_parse(run)))
            run.clear()

    for tok in text.split():
        w = tok.lower()
        core = w.strip(".,?!;:")
        if run and _fits(run[-1], core) and core == w:
            run.append(core)
            continue
        if run and _fits(run[-1], core):  # the number ends with punctuation
            run.append(core)
            close()
            out[-1] += w[len(core):] if w.startswith(core) else ""
            continue
        close()
        if _fits(None, core):
            if core == w:
                run.append(core)
            else:
                out.append(str(_parse([core])) + w[len(core):] if w.startswith(core) else tok)
            continue
        out.append(tok)
    close()
    return " ".join(out)
