"""Chat turns on an LM session: the model's chat template, applied one turn at a time.

``s.step(messages=[{"role": "user", "content": "Hello"}])`` (offline), ``sessions.step(sid,
messages=...)`` (``AsyncSessions``) and ``input: {"messages": [...]}`` on ``/v1/realtime`` append
only the formatted tokens of the turn's own messages and the generation prompt; the model's reply
follows, as a step's output. So after each turn the context is what a one-shot chat over the
whole history would prompt with (``LLM.chat``): the session never re-renders or re-prefills what
it already holds.

How a turn is rendered (``turn_tokens``), with the tokenizer's template (``engine/tokenizer.py``):

- on an empty context: ``template(messages, add_generation_prompt=True)``, exactly what
  ``LLM.chat(messages)`` tokenises (a default system prompt the template adds included);
- after a reply: what closes the reply, then the turn. Both come from rendering a fixed probe
  conversation: ``closed = template([user U, assistant A])``, ``opened = template([user U],
  add_generation_prompt=True)``; the reply's closing is what ``closed`` has after ``opened + A``
  (for ChatML ``<|im_end|>\\n``; its EOS is left out when the reply ended with the EOS token, which
  is already in the context), and the turn is what ``template([user U, assistant A, *messages],
  add_generation_prompt=True)`` has after ``closed``.

This holds for templates that render each message on its own (ChatML, Llama 3, Qwen, SmolLM2,
...); a template that renders a turn differently depending on what follows it is refused
(``ValueError``) rather than rendered inconsistently. A prompt is tokenised without the
tokenizer's own special tokens (the template writes them), as ``LLM.chat`` does. The context is
equal to the one-shot prompt when the replies' tokens are what their text tokenises to (a model
normally samples that way; a reply cut in the middle of a multi-byte character is not).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from execstate.engine.tokenizer import Tokenizer

MAX_MESSAGES = 256
MAX_CONTENT_CHARS = 1 << 20
ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
_PROBE_USER, _PROBE_REPLY = "\x00probe-user\x00", "\x00probe-reply\x00"


@dataclass(frozen=True)
class ChatTurn:
    """A step's input given as chat messages (``AsyncSessions.step(sid, ChatTurn(messages))``)."""

    messages: Sequence[Mapping[str, Any]]


def check_messages(messages: Any) -> list[dict[str, str]]:
    """``messages`` as plain ``{"role", "content"}`` dicts; ``ValueError`` naming what is wrong."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not 0 < len(messages) <= MAX_MESSAGES:
        raise ValueError(f"messages must be a list of 1-{MAX_MESSAGES} {{'role', 'content'}} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or set(m) - {"role", "content", "name"}:
            raise ValueError(f"messages[{i}] must be {{'role': str, 'content': str}}")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {sorted(ROLES)}, got {role!r}")
        if not isinstance(content, str) or len(content) > MAX_CONTENT_CHARS:
            raise ValueError(f"messages[{i}].content must be a string of at most {MAX_CONTENT_CHARS} characters")
        out.append({k: v for k, v in m.items() if isinstance(v, str)})
    return out


def turn_text(tokenizer: Tokenizer, messages: list[dict[str, str]], first: bool, after_eos: bool) -> str:
    """The text a turn appends (module docstring): ``first`` on an empty context; ``after_eos`` when
    the context ends with the EOS token."""
    render = tokenizer.apply_chat_template
    if first:
        return render(messages, add_generation_prompt=True)
    probe = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_REPLY}]
    opened = render(probe[:1], add_generation_prompt=True) + _PROBE_REPLY
    closed = render(probe, add_generation_prompt=False)
    full = render(probe + messages, add_generation_prompt=True)
    if not closed.startswith(opened) or not full.startswith(closed):
        raise ValueError("this model's chat template renders a turn differently depending on what follows it; "
                         "a session cannot apply it one turn at a time: send token ids or text")
    closing = closed[len(opened):]
    eos = tokenizer.eos_token
    if after_eos and eos and closing.startswith(eos):
        closing = closing[len(eos):]
    return closing + full[len(closed):]


def turn_tokens(tokenizer: Tokenizer | None, messages: Any, last_token: int | None) -> list[int]:
    """The token ids a chat turn of ``messages`` appends to a session whose context ends with
    ``last_token`` (``None``: an empty context)."""
    if tokenizer is None:
        raise ValueError("this model has no tokenizer: chat turns need its chat template")
    msgs = check_messages(messages)
    eos_id = tokenizer.token_to_id(tokenizer.eos_token) if tokenizer.eos_token else None
    after_eos = last_token is not None and eos_id is not None and last_token == eos_id
    return tokenizer.encode(turn_text(tokenizer, msgs, last_token is None, after_eos), add_special_tokens=False)
