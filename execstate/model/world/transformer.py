"""The world model's network: latent tokens of a chunk in, predicted clean latents out.

Two codecs (``WorldModelConfig.codec``): pixel patches (described below: a gated residual on
the carry) and palette cells (the default recipe since v3: per-cell logits, the newest carry
and its action-shifted copy added through learned per-colour gains, and with
``conv_channels`` a convolutional stem and head around the blocks, ``cell_conv.py``;
``forward(local_only=True)`` runs that conv path alone, with no blocks: training's first
stage). The rest of this docstring holds for both.

Token layout: a sequence is ``G`` groups (chunks) of ``F`` frames of ``P`` patch tokens,
frame-major. Each group also gets its *carry*: the clean latents of the ``carry_frames`` frames
just before the chunk (zeros before the first chunk). A token's input is its patch concatenated
with the carry frames' patches at the same place (channel concat, as GameNGen / Matrix-Game
condition on frames: where things were and how they moved), and the output is built on the
newest carry frame -- the static floor and walls are free, the network spends itself on what
moves. The output is *gated*: per latent value, a new value and
a gate, ``x1 = carry + sigmoid(gate) * (value - carry)`` (the gate starts near 0: copy). A
static pixel is kept exactly by a saturated gate, which needs no precision, where an additive
residual ``carry + delta`` had to produce an exact zero from the last hidden state: its errors
were coloured noise over the whole frame that compounded over a rollout. The noisy chunk enters scaled by its flow time
(``c_in(t) = t``, EDM-style input preconditioning): at ``t = 0`` it is pure noise and carries
no information, so the first sampler step is exactly a function of the context. Each token's embedding also gets a
learned spatial embedding (its patch's place), a learned frame-in-chunk embedding and the chunk's actions *up to
its frame* (``sum_{j <= f} E_j[key_j]``, one table per frame slot: the cumulative move, as
Matrix-Game's action module feeds each frame a window of recent actions), plus the camera
deltas' projection, cumulated the same way, when ``camera_dim > 0``. The flow time ``t`` of its chunk and its frame's
action form the conditioning vector that modulates every block (adaLN-single: one shared
projection, plus each block's own bias; gates start at zero so an untrained block is the
identity). Time position enters attention through :mod:`rope` only.

:meth:`WorldTransformer.forward` serves training (the whole teacher-forced sequence, a
block-causal mask, no context) and inference (one chunk, a gathered context, no mask) with the
same code. It returns the predicted clean latents (``x1``, i.e. x-prediction) and, per layer,
the chunk's un-rotated keys and values (what a commit stores).
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from execstate.model.world.cell_conv import CellConvHead, CellConvStem
from execstate.model.world.config import WorldModelConfig
from execstate.model.world.network import Block
from execstate.model.world.shift import shifted_carry

_T_FEATURES = 128
_GATE_INIT = -4.0
_COPY_GAIN_INIT = 2.0


def _t_features(t: torch.Tensor) -> torch.Tensor:
    half = _T_FEATURES // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    ang = (t.to(torch.float32) * 1000.0)[..., None] * freqs
    return torch.cat([ang.cos(), ang.sin()], dim=-1)


class WorldTransformer(nn.Module):
    def __init__(self, cfg: WorldModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        n_in = 1 + cfg.carry_frames + (1 if cfg.action_shift_px else 0)
        dim = cfg.latent_dim
        hid, units = cfg.conv_channels, cfg.latent_grid**2
        n_src = n_in + (1 if cfg.conv_prev_frame else 0)
        n_extra = cfg.frames_per_chunk * cfg.n_actions if cfg.conv_keys else 0
        self.stem = (CellConvStem(n_src, cfg.latent_channels, hid, cfg.latent_grid, cfg.conv_layers, n_extra)
                     if hid else None)
        self.head = CellConvHead(hid, cfg.latent_channels, cfg.latent_grid) if hid else None
        self.patch_in = nn.Linear(units * hid if hid else n_in * dim, d)
        self.pos_spatial = nn.Parameter(torch.randn(cfg.tokens_per_frame, d) * 0.02)
        self.pos_frame = nn.Parameter(torch.randn(cfg.frames_per_chunk, d) * 0.02)
        self.action_in = nn.Parameter(torch.randn(cfg.frames_per_chunk, cfg.n_actions, d) * 0.02)
        self.action_cond = nn.Parameter(torch.randn(cfg.frames_per_chunk, cfg.n_actions, d) * 0.02)
        self.camera_in = nn.Linear(cfg.camera_dim, d) if cfg.camera_dim else None
        self.t_embed = nn.Sequential(nn.Linear(_T_FEATURES, d), nn.SiLU(), nn.Linear(d, d))
        self.mod = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.words = nn.Embedding(cfg.text_buckets, cfg.text_dim)
        self.blocks = nn.ModuleList(Block(d, cfg.n_heads, cfg.mlp_ratio, cfg.text_dim) for _ in range(cfg.n_layers))
        self.final_mod = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
        self.palette = cfg.codec == "palette"
        # patch: per value a new value and a keep/replace gate; palette: per cell logits, plus the
        # newest carry frame's one-hot times a learned gain (starts by copying it)
        self.patch_out = nn.Linear(d, units * hid if hid else dim if self.palette else 2 * dim)
        # palette: per palette entry, the gain of the newest carry frame and of its action-shifted copy
        # (a skip from the inputs to the logits: static cells copy the carry, moved ones the shift)
        self.copy_gain = nn.Parameter(torch.full((cfg.latent_channels,), _COPY_GAIN_INIT)) if self.palette else None
        self.shift_gain = (nn.Parameter(torch.zeros(cfg.latent_channels))
                           if self.palette and cfg.action_shift_px else None)
        # zero-init: an untrained transformer adds nothing to the conv path's logits (with the
        # convolutions, a first training stage may train that path alone: the world tools' train.py,
        # local_steps)
        for lin in cast("tuple[nn.Linear, ...]", (self.mod[1], self.final_mod[1], self.patch_out)):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)
        if not self.palette:
            with torch.no_grad():
                self.patch_out.bias[dim:] = _GATE_INIT  # start by keeping the carry (copying)

    def prompt_kv(self, word_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``word_ids int64[N, Tt]`` -> cross-attention k, v ``[n_layers, N, Tt, H, Dh]``."""
        w = self.words(word_ids)
        kv = [blk.prompt_kv(w) for blk in cast("list[Block]", self.blocks)]
        return torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv])

    def forward(
        self,
        x: torch.Tensor,  # [B, G*F*P, latent_dim]
        carry: torch.Tensor,  # [B, G, carry_frames, P, latent_dim] the frames before each group (oldest first)
        t: torch.Tensor,  # [B, G] flow time of each group
        actions: torch.Tensor,  # int64 [B, G*F]
        camera: torch.Tensor | None,  # [B, G*F, camera_dim] or None
        cos: torch.Tensor,  # [G*F*P, Dh]
        sin: torch.Tensor,
        ctx_k: torch.Tensor | None,  # [L, B, Tc, H, Dh] rotated, or None
        ctx_v: torch.Tensor | None,
        attn_mask: torch.Tensor | None,  # bool [T, Tc + T] or None
        prompt_k: torch.Tensor | None,  # [L, B*G, Tt, H, Dh] (None only with local_only)
        prompt_v: torch.Tensor | None,
        prompt_mask: torch.Tensor | None,  # bool [B*G, Tt] or None
        want_output: bool = True,
        out_groups: int | None = None,  # predict only the last ``out_groups`` groups (default: all)
        local_only: bool = False,  # conv path only (training's first stage): no blocks, no K/V
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        cfg = self.cfg
        b, n_tok, _ = x.shape
        g = t.shape[1]
        f, p, d = cfg.frames_per_chunk, cfg.tokens_per_frame, cfg.d_model
        slot = torch.arange(f).repeat(g)
        act = self.action_in[slot, actions].view(b, g, f, d)
        if self.camera_in is not None and camera is not None:
            act = act + self.camera_in(camera).view(b, g, f, d)
        act = act.cumsum(2)
        cond_act = self.action_cond[slot, actions].view(b, g, f, d).cumsum(2)
        nc = cfg.carry_frames
        dim = cfg.latent_dim
        frames = carry.permute(0, 1, 3, 2, 4).reshape(b, g, 1, p, nc * dim).expand(b, g, f, p, -1)
        xin = x.view(b, g, f, p, -1) * t.to(x.dtype)[:, :, None, None, None]
        parts = [xin, frames]
        shifted = None
        if cfg.action_shift_px:
            shifted = shifted_carry(carry[:, :, -1], actions, f, cfg.latent_grid, cfg.action_shift_px,
                                    cfg.latent_channels).to(x.dtype)
            parts.append(shifted)
        local = None
        if self.stem is not None:
            srcs = [xin, *(carry[:, :, k : k + 1].expand(b, g, f, p, dim) for k in range(nc)), *parts[2:]]
            if cfg.conv_prev_frame:  # frame f-1's noisy input (zeros for the first frame)
                srcs.append(torch.cat([torch.zeros_like(xin[:, :, :1]), xin[:, :, :-1]], dim=2))
            extra = None
            if cfg.conv_keys:  # [B, G, F, F * n_actions]: frame f sees the one-hot keys of slots 0..f
                onehot = nn.functional.one_hot(actions.view(b, g, f), cfg.n_actions).to(x.dtype)
                upto = torch.tril(torch.ones(f, f, dtype=x.dtype))  # [frame, slot]
                extra = (upto[None, None, :, :, None] * onehot[:, :, None, :, :]).reshape(b * g * f, -1)
            local = self.stem(torch.stack(srcs, dim=-2).reshape(b * g * f, p, len(srcs), dim), extra)
            if local_only:
                go = g if out_groups is None else out_groups
                none = local.new_zeros((b * go * f, *local.shape[1:]))
                return self._output(none, local, carry, shifted, b, g, out_groups), None, None
            h = self.patch_in(local).view(b, g, f, p, d)
        elif local_only:
            raise ValueError("local_only needs the convolutional path (conv_channels > 0)")
        else:
            h = self.patch_in(torch.cat(parts, dim=-1))
        h = h + self.pos_spatial + self.pos_frame[:, None, :] + act[:, :, :, None, :]
        h = h.view(b, n_tok, d)
        cond = self.t_embed(_t_features(t))[:, :, None, :] + cond_act
        mod = self.mod(cond).view(b, g * f, 1, 6, d)
        ks, vs = [], []
        assert prompt_k is not None and prompt_v is not None  # None only with local_only (returned above)
        for i, blk in enumerate(self.blocks):
            h, k, v = blk(h, mod, cos, sin, None if ctx_k is None else ctx_k[i], None if ctx_v is None else ctx_v[i],
                          attn_mask, prompt_k[i], prompt_v[i], prompt_mask)
            ks.append(k)
            vs.append(v)
        k_all, v_all = torch.stack(ks), torch.stack(vs)
        if not want_output:
            return None, k_all, v_all
        go = g if out_groups is None else out_groups
        shift, scale = self.final_mod(cond[:, g - go :]).view(b, go * f, 1, 2, d).unbind(3)
        h = h.view(b, g * f, p, d)[:, (g - go) * f :]
        out = self.patch_out(nn.functional.layer_norm(h, (d,)) * (1 + scale) + shift)
        return self._output(out, local, carry, shifted, b, g, out_groups), k_all, v_all

    def _output(self, out: torch.Tensor, local: torch.Tensor | None, carry: torch.Tensor,
                shifted: torch.Tensor | None, b: int, g: int, out_groups: int | None) -> torch.Tensor:
        """The last ``out_groups`` groups' predicted clean latents from the transformer's output
        ``out`` (only those groups' frames) and the stem's cell features ``local`` (all groups)."""
        cfg = self.cfg
        f, p, dim = cfg.frames_per_chunk, cfg.tokens_per_frame, cfg.latent_dim
        go = g if out_groups is None else out_groups
        if self.head is not None and local is not None:  # the stem's cell features skip the transformer (U-Net)
            skip = local.view(b, g, f, p, -1)[:, g - go :].reshape(b * go * f, p, -1)
            out = self.head(out.reshape(b * go * f, p, -1) + skip).view(b, go * f, p, dim)
        base = carry[:, g - go :, -1:].expand(b, go, f, p, dim).reshape(b, go * f, p, dim)
        if self.copy_gain is not None:  # logits
            c = cfg.latent_channels
            x1 = out + (base.unflatten(-1, (-1, c)) * self.copy_gain).flatten(-2)
            if self.shift_gain is not None and shifted is not None:
                sh = shifted[:, g - go :].reshape(b, go * f, p, -1, c)
                x1 = x1 + (sh * self.shift_gain).flatten(-2)
        else:
            value, gate = out.chunk(2, dim=-1)
            x1 = base + torch.sigmoid(gate) * (value - base)
        return x1.reshape(b, go * f * p, dim)
