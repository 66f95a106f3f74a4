"""Degraded context for training the maze model (GameNGen's noise augmentation, a step further).

A free-running model feeds itself its own frames: a little blurrier, a little off in colour and
brightness each chunk. Trained only on the renderer's frames as context, it copies those faults
forward and they compound (measured: the frames wash out to a grey-teal blur within 50 to 100
chunks). :func:`degrade` corrupts the frames a training sample attends to and carries (never the
sink: a session's sink is the rendered start, always clean) while the targets stay the renderer's,
so the model learns to restore what its own outputs lose: sharpness (a Gaussian blur of sigma up
to ``max_blur`` pixels), colour and brightness (a gain and an offset per channel), and fine noise.
Each chunk of each sample draws its own strength; a share ``p_clean`` of them is left as is.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

MAX_BLUR = 1.5
MAX_GAIN = 0.12
MAX_OFFSET = 0.08
MAX_NOISE = 0.06
P_CLEAN = 0.3


def _blur(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """``x [N, H, W, 3]`` blurred with per-item Gaussian ``sigma [N]`` (pixels; 0: unchanged)."""
    r = 3
    t = torch.arange(-r, r + 1, dtype=x.dtype)
    k = torch.exp(-(t[None, :] ** 2) / (2 * sigma.clamp(min=1e-3)[:, None] ** 2))
    k = k / k.sum(dim=1, keepdim=True)  # [N, 7]
    img = x.permute(0, 3, 1, 2)  # [N, 3, H, W]
    n, c, h, w = img.shape
    pad = F.pad(img.reshape(1, n * c, h, w), (r, r, r, r), mode="replicate")
    kk = k.repeat_interleave(c, dim=0)  # [N*3, 7]
    out = F.conv2d(pad, kk[:, None, None, :], groups=n * c)
    out = F.conv2d(out, kk[:, None, :, None], groups=n * c)
    out = out.reshape(n, c, h, w).permute(0, 2, 3, 1)
    return torch.where((sigma > 0)[:, None, None, None], out, x)


def degrade(frames: torch.Tensor, rng: np.random.Generator, p_clean: float = P_CLEAN) -> torch.Tensor:
    """``frames [..., H, W, 3]`` in [-1, 1], each frame (leading index) degraded (module docstring)."""
    shape = frames.shape
    x = frames.reshape(-1, *shape[-3:]).float()
    n = x.shape[0]
    strength = torch.from_numpy(rng.random(n).astype(np.float32)) * torch.from_numpy(
        (rng.random(n) >= p_clean).astype(np.float32))
    sigma = strength * MAX_BLUR
    gain = 1 + (torch.from_numpy(rng.uniform(-1, 1, (n, 1, 1, 3)).astype(np.float32)) * MAX_GAIN
                * strength[:, None, None, None])
    offset = (torch.from_numpy(rng.uniform(-1, 1, (n, 1, 1, 3)).astype(np.float32)) * MAX_OFFSET
              * strength[:, None, None, None])
    noise = torch.from_numpy(rng.standard_normal(x.shape).astype(np.float32)) * MAX_NOISE * strength[:, None, None,
                                                                                                      None]
    out = (_blur(x, sigma) * gain + offset + noise).clamp(-1, 1)
    return out.reshape(shape).to(frames.dtype)
