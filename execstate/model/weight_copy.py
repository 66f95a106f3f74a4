"""In-place weight updates of a loaded model: validate everything, then copy into the parameters.

``plan_weight_copy(model, state_dict)`` checks an HF-named state dict against the model's
existing parameters, with the loader's name mapping (``loader.match_checkpoint``):

- names: every parameter has a source, nothing unexpected (as at load);
- values: every tensor is a ``torch.Tensor`` with a floating-point dtype, not on ``meta``
  (a float of another width is cast on copy, as at load; integers, bools and complex
  numbers are refused);
- shapes: each checkpoint tensor has exactly the shape of the region of the parameter it
  fills (q|k|v rows of ``qkv_proj``, gate|up rows of ``gate_up_proj``, one expert's slice
  of the stacked ``w_gate_up`` / ``w_down``).

Any problem raises one ``ValueError`` naming every offending tensor, before anything is
copied: the model is unchanged. ``WeightCopyPlan.apply()`` then copies each tensor into
its region (``Tensor.copy_`` under ``no_grad``): no parameter is reallocated, so every
``data_ptr`` stays the same, and the fused tensors the loader builds (``qkv_proj``,
``gate_up_proj``, the stacked experts) are the parameters themselves, filled slice by
slice with no temporary of their size. The model keeps no other copy of its weights (no
packed or kernel-specific layouts: the CPU kernels read the parameters directly), so
nothing else needs refreshing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from execstate.model.loader import checkpoint_error, match_checkpoint
from execstate.model.transformer import CausalLM


@dataclass(frozen=True)
class WeightCopyPlan:
    """Validated (destination region, source tensor) pairs; ``apply`` performs the copies."""

    copies: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    @property
    def num_bytes(self) -> int:
        """Bytes written into the model's parameters."""
        return sum(dst.numel() * dst.element_size() for dst, _ in self.copies)

    def apply(self) -> None:
        """Copy every tensor into its region of the parameters (in place, no reallocation)."""
        with torch.no_grad():
            for dst, src in self.copies:
                dst.copy_(src)


def _bad_values(state_dict: dict[str, torch.Tensor]) -> dict[str, str]:
    bad: dict[str, str] = {}
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor):
            bad[name] = f"{name} (a {type(t).__name__}, not a tensor)"
        elif not t.is_floating_point():
            bad[name] = f"{name} ({t.dtype}, need a floating-point dtype)"
        elif t.device.type == "meta":
            bad[name] = f"{name} (on the meta device: no data)"
    return bad


def plan_weight_copy(model: CausalLM, state_dict: dict[str, torch.Tensor]) -> WeightCopyPlan:
    """Validate ``state_dict`` against ``model``'s parameters (see the module docstring).

    Raises ``ValueError`` naming every missing, unexpected, wrongly-typed or wrongly-shaped
    tensor; changes nothing.
    """
    if not isinstance(state_dict, dict):
        raise ValueError(f"a state dict must be a dict of tensors, got {type(state_dict).__name__}")
    if any(p.dtype == torch.uint8 for p in model.parameters()):
        raise ValueError("a model served from GGUF blocks (quantization='gguf') takes no weight updates: "
                         "its matrices are the file's quantised bytes; start an engine on the new file")
    bad_value = _bad_values(state_dict)
    matches, missing, unexpected = match_checkpoint(model, state_dict)
    params = dict(model.named_parameters(remove_duplicate=False))
    bad_shape: list[str] = []
    copies: list[tuple[torch.Tensor, torch.Tensor]] = []
    for target, (src, parts) in matches.items():
        param = params[target]
        if any(n in bad_value for n in src.names):
            continue
        try:
            views = src.views(param, parts)
        except (RuntimeError, IndexError):
            views = []
        if len(views) != len(parts):
            shapes = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(src.names[:3], parts, strict=False))
            bad_shape.append(f"{target} {tuple(param.shape)} cannot be filled from {shapes}"
                             f"{'...' if len(parts) > 3 else ''}")
            continue
        for name, part, view in zip(src.names, parts, views, strict=True):
            if part.shape != view.shape:
                bad_shape.append(f"{name}: got {tuple(part.shape)}, expected {tuple(view.shape)}")
            else:
                copies.append((view, part))
    err = checkpoint_error(model.config, [("missing tensors", missing), ("unexpected tensors", unexpected),
                                          ("wrongly-typed tensors", [bad_value[n] for n in sorted(bad_value)]),
                                          ("wrongly-shaped tensors", bad_shape)])
    if err is not None:
        raise err
    return WeightCopyPlan(tuple(copies))
