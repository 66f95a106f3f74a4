"""Constrained decoding (structured outputs) on llguidance's grammar engine.

- ``spec.py``: :class:`StructuredOutputsParams`, what a request asks for (vLLM's names: ``json``,
  ``regex``, ``choice``, ``grammar``, ``json_object``), pure Python;
- ``bounds.py``: :class:`GrammarBounds` and the size / nesting / enum checks run before compiling;
- ``compiler.py``: :class:`GrammarCompiler`, one per engine: spec -> :class:`CompiledGrammar`
  (a pristine llguidance matcher, cached), under llguidance's resource limits;
- ``matcher.py``: :class:`GrammarMatcher`, the matcher state of one request or session (advance,
  copy, rollback) and its serialisable form :class:`GrammarSnapshot`;
- beside this package, ``engine/grammar_masks.py`` (it reads the scheduler's output): the token
  masks of a step's constrained rows, computed on a worker thread while the forward pass runs,
  and ``engine/token_mask.py``, which the sampler applies.

llguidance was chosen over xgrammar because it installs alone (no dependencies; xgrammar 0.2.8
pulls a CUDA torch, triton and a newer transformers into a clean environment) and runs on CPU.
"""
