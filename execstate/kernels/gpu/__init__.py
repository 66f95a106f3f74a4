"""GPU kernels of the torch path, written in Triton, each with a torch reference.

- ``paged_attention.py``: attention of every query row straight on the paged KV cache (decode,
  prefill after a cached prefix, chunked prefill), one program per (token, KV head), no gathered
  copy of a context. Reference: float64 attention over the gathered context.
- ``grouped_mm.py``: grouped GEMM over expert-sorted rows (the MoE experts) and, with one group,
  the batch-invariant dense linear. Reference: ``torch.matmul`` per group.
- ``rows.py``: row-wise RMSNorm, softmax and log-softmax, one program per row. Reference: torch.

Every kernel computes an output row with the same operations whatever the other rows of its
launch are (fixed tile shapes, no split-K, no atomics): results are batch-invariant, and a
query row of the attention kernel gets the same bits in a prefill and in a decode. That is what
the deterministic mode (``model/gpu_path.py``) relies on.

Triton is optional (the ``gpu`` extra; ``make setup`` installs it with ``--no-deps``): without
it the torch path runs torch ops only. On a machine without a GPU the kernels run under
Triton's interpreter (``TRITON_INTERPRET=1``, set before this package's kernel modules are
imported), which is how CI tests them; compiled Triton code runs only on a GPU
(``scripts/gpu_check.sh``). ``kernels/family.py`` (importable without Triton) names each kernel
set for the provenance numerics and says where Triton runs. Without Triton, importing this package
raises ``ImportError`` naming the extra.
"""

from execstate.kernels.family import interpreted, triton_available

if not triton_available():
    raise ImportError("execstate.kernels.gpu needs Triton: pip install 'execstate[gpu]' "
                      "(with --no-deps, so the CPU torch stays)")

if interpreted():
    from execstate.kernels.gpu import interpreter_fix

    interpreter_fix.apply()
