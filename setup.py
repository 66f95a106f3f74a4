"""Builds execstate's optional C extension (execstate/kernels/csrc/); everything else is in
pyproject.toml. ``optional=True``: without a C compiler the install still succeeds and the
engine uses torch's kernels (``execstate.kernels.cpu.available()`` is then False)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "execstate.kernels._cpu",
            [f"execstate/kernels/csrc/{name}.c" for name in ("module", "gemm", "attention", "fused", "gemm_bf16",
                                                              "gemm_packed", "prefill_attention", "decode_layer", "scratch",
                                                              "gemm_bf16_pairs", "gemm_bf16dot", "gemm_bf16dot_emu",
                                                              "gemm_gguf", "decode_moe", "decode_spec", "token_mask",
                                                              "moe_bf16dot")],
            depends=["execstate/kernels/csrc/kernels.h", "execstate/kernels/csrc/simd.h",
                     "execstate/kernels/csrc/decode_layer.h", "execstate/kernels/csrc/simd512.h",
                     "execstate/kernels/csrc/step_clock.h", "execstate/kernels/csrc/bf16dot_tile.h"],
            # -ffp-contract=off: no implicit FMA contraction; the kernels' FMAs are explicit,
            # so every code path rounds the same way (see the numerics note in csrc/module.c).
            extra_compile_args=["-O3", "-fopenmp", "-ffp-contract=off", "-std=c11"],
            extra_link_args=["-fopenmp"],
            optional=True,
        )
    ]
)
