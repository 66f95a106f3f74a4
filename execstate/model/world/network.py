"""The transformer block of the world model (self-attention over context + chunk, cross-attention
to the prompt, MLP; adaLN modulation by the flow time and the frame's action).

Self-attention takes the chunk's own tokens plus an optional *context*: keys already rotated
and values of earlier frames (gathered from the KV pool by ``kv.gather_context``). It returns the
chunk's un-rotated, normalised keys and its values, which a commit writes to the pool; the block
never touches the pool itself. Cross-attention reads per-group prompt keys/values (a group is a
chunk: every chunk may have its own prompt version) computed once per prompt by
:meth:`Block.prompt_kv`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from execstate.model.world.rope import rotate


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int, mlp_ratio: int, text_dim: int) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d // n_heads
        self.qkv = nn.Linear(d, 3 * d)
        self.q_norm = nn.Parameter(torch.ones(self.head_dim))
        self.k_norm = nn.Parameter(torch.ones(self.head_dim))
        self.proj = nn.Linear(d, d)
        self.cross_norm = nn.LayerNorm(d)
        self.cross_q = nn.Linear(d, d)
        self.cross_kv = nn.Linear(text_dim, 2 * d)
        self.cross_out = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, mlp_ratio * d), nn.GELU(approximate="tanh"), nn.Linear(mlp_ratio * d, d))
        self.mod_bias = nn.Parameter(torch.zeros(6, d))

    def prompt_kv(self, words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``words [..., Tt, text_dim]`` -> cross-attention k, v ``[..., Tt, H, Dh]``."""
        k, v = self.cross_kv(words).unflatten(-1, (2, self.n_heads, self.head_dim)).unbind(-3)
        return k, v

    def forward(
        self,
        x: torch.Tensor,  # [B, T, d], T = frames * P
        mod: torch.Tensor,  # [B, frames, 1, 6, d] per-frame global modulation (the block adds its bias)
        cos: torch.Tensor,  # [T, Dh]
        sin: torch.Tensor,
        ctx_k: torch.Tensor | None,  # [B, Tc, H, Dh] rotated
        ctx_v: torch.Tensor | None,
        attn_mask: torch.Tensor | None,  # bool [T, Tc + T] (True: attend) or None (attend to all)
        prompt_k: torch.Tensor,  # [B * G, Tt, H, Dh]
        prompt_v: torch.Tensor,
        prompt_mask: torch.Tensor | None,  # bool [B * G, Tt] or None (all valid)
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, d = x.shape
        h, dh = self.n_heads, self.head_dim
        nf = mod.shape[1]
        shift1, scale1, gate1, shift2, scale2, gate2 = (mod + self.mod_bias).unbind(3)

        a = (F.layer_norm(x, (d,)).view(b, nf, -1, d) * (1 + scale1) + shift1).view(b, t, d)
        q, k, v = self.qkv(a).view(b, t, 3, h, dh).unbind(2)
        q = F.rms_norm(q, (dh,), self.q_norm.to(q.dtype))
        k = F.rms_norm(k, (dh,), self.k_norm.to(k.dtype))
        kr = rotate(k, cos, sin)
        keys = kr if ctx_k is None else torch.cat([ctx_k, kr], dim=1)
        vals = v if ctx_v is None else torch.cat([ctx_v, v], dim=1)
        att = F.scaled_dot_product_attention(
            rotate(q, cos, sin).transpose(1, 2), keys.transpose(1, 2), vals.transpose(1, 2), attn_mask=attn_mask)
        x = x + (gate1 * self.proj(att.transpose(1, 2).reshape(b, t, d)).view(b, nf, -1, d)).view(b, t, d)

        g = prompt_k.shape[0] // b
        cq = self.cross_q(self.cross_norm(x)).view(b * g, t // g, h, dh).transpose(1, 2)
        cmask = None if prompt_mask is None else prompt_mask[:, None, None, :]
        c = F.scaled_dot_product_attention(cq, prompt_k.transpose(1, 2), prompt_v.transpose(1, 2), attn_mask=cmask)
        x = x + self.cross_out(c.transpose(1, 2).reshape(b, t, d))

        m = (F.layer_norm(x, (d,)).view(b, nf, -1, d) * (1 + scale2) + shift2).view(b, t, d)
        x = x + (gate2 * self.mlp(m).view(b, nf, -1, d)).view(b, t, d)
        return x, k, v
