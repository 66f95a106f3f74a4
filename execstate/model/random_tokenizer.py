"""A tiny byte-level BPE tokenizer for the tiny random models (tests and benchmarks).

``write_tokenizer(model_dir)`` writes ``tokenizer.json`` and ``tokenizer_config.json``
(with a chat template) next to a ``make_random`` model: exactly ``VOCAB`` ids (3
specials ``<pad>``/``<s>``/``</s>``, the 256 byte symbols, then letter-pair merges), so
every id the model can sample decodes; random ids give split and invalid UTF-8, which
is what detokenisation must handle. Built with the ``tokenizers`` library, no download.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

VOCAB = 512
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_tokenizer(model_dir: Path) -> Path:
    """Byte-level BPE over exactly VOCAB ids: 3 specials, 256 bytes, letter-pair merges."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    letters = "etaoinsrhldcumfpgwybvkxjqz"
    merges = []
    for a, b in [("Ġ", x) for x in letters] + [(x, y) for x in letters for y in letters]:
        if len(vocab) == VOCAB:
            break
        vocab[a + b] = len(vocab)
        merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    model_dir = Path(model_dir)
    tok.save(str(model_dir / "tokenizer.json"))
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
    return model_dir
