"""Builds execstate's optional C extension (execstate/kernels/_cpu.c); everything else is in
pyproject.toml. ``optional=True``: without a C compiler the install still succeeds and the
engine uses torch's kernels (``execstate.kernels.cpu.available()`` is then False)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "execstate.kernels._cpu",
            ["execstate/kernels/_cpu.c"],
            # -ffp-contract=off: no implicit FMA contraction; the kernels' FMAs are explicit,
            # so every code path rounds the same way (see the numerics note in _cpu.c).
            extra_compile_args=["-O3", "-fopenmp", "-ffp-contract=off", "-std=c11"],
            extra_link_args=["-fopenmp"],
            optional=True,
        )
    ]
)
