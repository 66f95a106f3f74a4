"""Tokenizer and chat template of a Hugging Face model directory.

Uses the ``tokenizers`` library on ``tokenizer.json`` (fast, no ``transformers``
import) and renders the chat template with jinja2 the way ``transformers`` does
(``messages``, ``add_generation_prompt``, ``bos_token``/``eos_token``,
``raise_exception``). The template comes from ``chat_template.jinja`` or the
``chat_template`` field of ``tokenizer_config.json``, unless the operator gave one
(``chat_template``: ``execstate serve --chat-template``, ``engine/chat_template.py``); it is
compiled once, when the tokenizer loads (an operator's template that does not compile is a
``ValueError`` then), and rendered per request.

Thread safety: a loaded ``Tokenizer`` is immutable and may be used from any thread.
``encode`` runs with the GIL released (``tokenizers``' ``encode`` holds it for the
whole call, ``encode_batch`` does not), so a long prompt tokenised in a worker thread
does not stall an event loop in another.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from execstate.engine.validation import check_prompt_length


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    """The jinja environment ``transformers`` renders chat templates in."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, indent=indent, ensure_ascii=False)
    return env


def compile_template(template: str) -> jinja2.Template:
    """``template`` compiled as ``transformers`` compiles chat templates (``jinja2.TemplateError`` if it
    does not)."""
    return _environment().from_string(template)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        content: str | None = value.get("content")
        return content
    return cast(str | None, value)


class Tokenizer:
    def __init__(self, model_dir: str | Path, chat_template: str | None = None) -> None:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
        self._tok = HFTokenizer.from_file(str(path))
        cfg_path = model_dir / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        template = cfg.get("chat_template")
        jinja_path = model_dir / "chat_template.jinja"
        if jinja_path.exists():
            template = jinja_path.read_text()
        if isinstance(template, list):  # named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if chat_template is not None:  # the operator's, in place of the model's
            template = chat_template
        self.chat_template: str | None = template
        self._template: jinja2.Template | None = None
        self._template_error: str | None = None
        if template:
            try:
                self._template = compile_template(template)
            except jinja2.TemplateError as exc:  # the model's: reported when a chat request needs it
                self._template_error = f"the chat template does not compile: {exc}"
                if chat_template is not None:
                    raise ValueError(f"--chat-template: {self._template_error}") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        # The most characters one token's text can cover: every token's vocabulary string is at least
        # as long as the text it stands for (byte-level: one character per byte; "##" and "<0x..>"
        # forms are longer). A normalizer may shrink the text first (NFKC composes characters):
        # then 4x that, a margin no composition reaches.
        longest = max((len(t) for t in self._tok.get_vocab(with_added_tokens=True)), default=1)
        self.max_chars_per_token = max(1, longest) * (1 if self._tok.normalizer is None else 4)

    def max_chars(self, max_model_len: int) -> int:
        """The longest text that could fit in ``max_model_len`` tokens: beyond it, no need to tokenise."""
        return max_model_len * self.max_chars_per_token

    def encode(self, text: str, add_special_tokens: bool = True, max_model_len: int | None = None) -> list[int]:
        """Token ids of ``text``, computed with the GIL released. With ``max_model_len``, a
        prompt that cannot fit raises ``ValueError``: at once, without tokenising, when the text is
        longer than :meth:`max_chars` (a megabyte body costs nothing), else before its ids become a
        Python list."""
        if max_model_len is not None and len(text) > self.max_chars(max_model_len):
            raise ValueError(f"prompt is too long: {len(text)} characters, but at most {self.max_chars(max_model_len)} "
                             f"can fit in max_model_len {max_model_len} tokens ({self.max_chars_per_token} characters "
                             "per token at most with this tokenizer); refused without tokenising")
        encoding = self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        if max_model_len is not None:
            check_prompt_length(len(encoding), max_model_len)
        return encoding.ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    @property
    def backend(self) -> HFTokenizer:
        """The ``tokenizers.Tokenizer`` itself (for ``DecodeStream``)."""
        return self._tok

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        if self._template is None:
            raise ValueError(self._template_error or "this model has no chat template; pass a plain prompt instead")
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **kwargs,
        )
