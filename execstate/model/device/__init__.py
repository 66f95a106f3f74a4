"""The torch path's device side: what a step needs so that it never waits on the host.

- ``upload.py``: host arrays to the device without a blocking copy (pinned memory, async).
- ``moe_dispatch.py``: MoE experts without a host read (tokens sorted by expert on the device,
  a grouped GEMM over device-side group ends).
- ``attention.py``: the attention backend over the paged KV cache whose tables are device
  tensors (the Triton kernel, or a torch fallback with device-side index math).

Which kernels a model runs, and the deterministic mode, are switched by ``model/gpu_path.py``.
"""
