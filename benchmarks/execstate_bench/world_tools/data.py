"""Training data drawn from the renderer: chunk sequences laid out as the rolling window sees them.

A sample is ``N = sink_chunks + window_chunks + 1`` chunks of one random trajectory: the first
chunk (the sink) and ``N - 1`` consecutive chunks starting at chunk ``s`` -- ``s = 1`` (a
contiguous start, half the samples) or a random later chunk up to ``max_start`` (the window after
older chunks were released). Time positions are assigned in this order (see :mod:`rope`), so
the model is trained on exactly the layouts a rolling window produces.

Prompts: a theme word (or none, for the default theme) mixed with filler words; with
probability ``p_theme_change`` the theme (and the prompt text) changes at the start of one of
the window's chunks, as a prompt event at a chunk boundary does. Actions are sticky random keys
(``renderer.random_actions``). Everything is drawn from the given numpy generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from execstate.model.world import renderer
from execstate.model.world.config import WorldModelConfig
from execstate.model.world.latent_codec import LatentCodec
from execstate.model.world.prompt import word_ids

FILLERS = ("a", "the", "world", "maze", "level", "with", "walls", "game", "top", "down", "view", "small",
           "bright", "dark", "map", "of", "scene", "please")


def random_prompt(rng: np.random.Generator, theme: str) -> str:
    words = [str(w) for w in rng.choice(FILLERS, size=int(rng.integers(0, 5)), replace=False)]
    if theme != renderer.DEFAULT_THEME or rng.random() < 0.7:
        words.insert(int(rng.integers(0, len(words) + 1)), theme)
    return " ".join(words)


@dataclass(frozen=True)
class Batch:
    latents: torch.Tensor  # float32 [B, N, tokens_per_chunk, latent_dim] (clean)
    actions: torch.Tensor  # int64 [B, N * F]
    word_ids: torch.Tensor  # int64 [B, N, max_prompt_words + 1] (0-padded)
    word_mask: torch.Tensor  # bool [B, N, max_prompt_words + 1]
    changed: torch.Tensor  # bool [B, N, tokens_per_chunk, latent_grid**2]: latent unit differs from the frame before
    carry: torch.Tensor  # float32 [B, N, carry_frames, tokens_per_frame, latent_dim]: the frames before each
    # chunk, oldest first (0 for the sink)


def sample_batch(rng: np.random.Generator, cfg: WorldModelConfig, batch_size: int, max_start: int = 24,
                 p_theme_change: float = 0.3) -> Batch:
    f, n = cfg.frames_per_chunk, cfg.sink_chunks + cfg.window_chunks + 1
    if cfg.sink_chunks != 1:
        raise ValueError("training data supports one sink chunk")
    tw = cfg.max_prompt_words + 1
    lc = LatentCodec(cfg)
    lat, acts, ids, masks, changed, carries = [], [], [], [], [], []
    for _ in range(batch_size):
        s = 1 if max_start <= 1 or rng.random() < 0.5 else int(rng.integers(2, max_start + 1))
        starts = [0] + [(s + m) * f for m in range(n - 1)]
        total = starts[-1] + f
        actions = renderer.random_actions(rng, total)
        actions[0] = renderer.NONE
        themes = [str(rng.choice(renderer.THEME_NAMES))] * n
        if rng.random() < p_theme_change:
            c = int(rng.integers(1, n))
            new = str(rng.choice([t for t in renderer.THEME_NAMES if t != themes[0]]))
            themes[c:] = [new] * (n - c)
        prompts = [random_prompt(rng, themes[0])]
        for i in range(1, n):
            prompts.append(prompts[-1] if themes[i] == themes[i - 1] else random_prompt(rng, themes[i]))
        state = renderer.random_state(rng, themes[0])
        nc = cfg.carry_frames
        want = {starts[i] + j: i for i in range(n) for j in range(-nc, f)}
        frames: dict[int, np.ndarray] = {}
        for k in range(total):
            if k:
                state = renderer.step(state, int(actions[k]))
            if k in want:
                chunk = want[k] if k - starts[want[k]] >= 0 else want[k] - 1
                state = renderer.set_theme(state, themes[max(chunk, 0)])
                frames[k] = renderer.render(state)
        clips = np.stack([np.stack([frames[st + j] for j in range(f)]) for st in starts])
        prev = np.stack([np.stack([frames.get(st + j - 1, frames[st + j]) for j in range(f)]) for st in starts])
        x = lc.encode(clips).reshape(n, cfg.tokens_per_chunk, cfg.latent_dim)
        lat.append(x)
        xp = lc.encode(prev)
        changed.append(x != xp.reshape(x.shape))
        # a carry frame before frame 0 is "no frame" (zeros), as in a session's initial carry; the
        # sink's carry is all such frames (with F < carry_frames, so are the first ones after it)
        missing = torch.tensor([[st == 0 or st - nc + j < 0 for j in range(nc)] for st in starts])
        before = np.stack([np.stack([frames.get(st - nc + j, clips[0, 0]) for j in range(nc)]) for st in starts])
        carry = lc.encode(before)
        carry[missing] = 0.0
        carries.append(carry)
        acts.append(torch.from_numpy(np.concatenate([actions[st : st + f] for st in starts])))
        wid = torch.zeros((n, tw), dtype=torch.int64)
        wmask = torch.zeros((n, tw), dtype=torch.bool)
        for i, pr in enumerate(prompts):
            w = word_ids(pr, cfg.text_buckets, cfg.max_prompt_words)
            wid[i, : len(w)] = torch.tensor(w)
            wmask[i, : len(w)] = True
        ids.append(wid)
        masks.append(wmask)
    ch = lc.unit_mask(torch.stack(changed))
    return Batch(torch.stack(lat), torch.stack(acts), torch.stack(ids), torch.stack(masks), ch, torch.stack(carries))
