"""A chat template given by the operator (``execstate serve --chat-template``, vLLM's option).

The value is what vLLM accepts: the path of a Jinja template file, or the template's text itself.
:func:`load_chat_template` reads it once, at start-up:

- a file that can be read: its text;
- otherwise, a value with a Jinja character (``{``, ``}``) or a line break is the template's text,
  its backslash escapes decoded (``\\n`` typed on a command line is a line break);
- otherwise the value looks like a path that cannot be opened: ``ValueError`` naming it (a typo
  in a file name is never served as a one-line template).

The engine's tokenizer (``engine/tokenizer.py``) then renders every chat prompt with it instead of
the model's own template: chat completions, ``/tokenize`` with messages, the chat turns of
sessions (HTTP and realtime), ``LLM.chat``. A template that does not compile is refused here (and by
the tokenizer, for an ``EngineConfig.chat_template`` given directly), not at the first chat request.
"""

from __future__ import annotations

from pathlib import Path

import jinja2

from execstate.engine.tokenizer import compile_template

_TEMPLATE_CHARS = ("{", "}", "\n")


def load_chat_template(value: str | Path) -> str:
    """The template text ``value`` stands for (module docstring); ``ValueError`` when it names a file
    that cannot be read, or the template is empty or does not compile."""
    try:
        text = Path(value).read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:  # not a readable file (ValueError: a NUL in the value)
        if isinstance(value, Path) or not any(c in value for c in _TEMPLATE_CHARS):
            raise ValueError(f"the chat template {str(value)!r} looks like a file path, but it cannot be read "
                             f"({exc})") from None
        # backslash escapes decoded; characters outside latin-1 survive as their own escapes
        text = value.encode("latin-1", "backslashreplace").decode("unicode_escape")
    if not text.strip():
        raise ValueError(f"the chat template {str(value)!r} is empty")
    try:
        compile_template(text)
    except jinja2.TemplateError as exc:
        raise ValueError(f"the chat template does not compile: {exc}") from None
    return text
