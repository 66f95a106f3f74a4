"""Tool calls in a model's output: one parser per model family, shared by the OpenAI API and the agent.

- ``call.py``: :class:`ToolCall` (a function name and its arguments) and :class:`FunctionSpec`
  (a tool as OpenAI declares it: name, description, JSON Schema of its parameters);
- ``parser.py``: the :class:`ToolParser` interface (vLLM's ``--tool-call-parser``): split a
  streamed output into text and calls, the grammar that forces calls (``tool_choice`` required or
  named), and how tools and past calls are written into a prompt whose chat template does not;
- ``hermes.py``: the Hermes / Qwen / SmolLM2 format, ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``;
- ``parsers.py``: a parser by name (``tool_parser("hermes")``).

Pure Python: nothing here imports the rest of execstate (the grammar is Lark text that
``engine/grammar/`` compiles).
"""
