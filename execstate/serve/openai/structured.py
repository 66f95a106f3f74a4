"""A request's structured-output constraint: from its body to a compiled grammar, or a 400.

Sources, at most one per request (else 400 naming both):

- OpenAI's ``response_format``: ``{"type": "text"}`` (none), ``{"type": "json_object"}``, or
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``; without ``strict: true``
  keywords the grammar engine does not implement are ignored (``lenient``), with it they are a 400;
- vLLM's ``structured_outputs``: ``{"json" | "regex" | "choice" | "grammar" | "json_object": ...}``;
- a forced tool call (``tool_choice`` ``"required"`` or a named function, ``serve/openai/tools.py``).

``compile_constraint`` compiles it off the event loop, in the server's grammar workers (not the
prompt workers: a slow compile never delays tokenising), under ``GrammarBounds`` (size, nesting,
enum length, llguidance's own fuel limits) and a wall-clock timeout: whatever goes wrong is a 400
before any engine request exists; the compiled grammar stays in the engine's compiler cache, where
the engine finds it when the request is added. A compile that times out runs on in its worker
until llguidance's limits stop it; other requests never wait for it.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from execstate.engine.grammar.spec import StructuredOutputsParams
from execstate.serve.context import ServeContext
from execstate.serve.errors import bad_request
from execstate.serve.openai.protocol import SamplingRequest


def constraint_of(req: SamplingRequest, forced_tools: StructuredOutputsParams | None = None
                  ) -> StructuredOutputsParams | None:
    """The request's constraint (module docstring), validated; 400 naming the field."""
    found: list[tuple[str, StructuredOutputsParams]] = []
    if req.response_format is not None:
        spec = _response_format(req.response_format)
        if spec is not None:
            found.append(("response_format", spec))
    if req.structured_outputs is not None:
        if not isinstance(req.structured_outputs, dict):
            raise bad_request("structured_outputs must be an object", param="structured_outputs")
        try:
            found.append(("structured_outputs", StructuredOutputsParams.from_dict(req.structured_outputs)))
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc), param="structured_outputs") from None
    if forced_tools is not None:
        found.append(("tool_choice", forced_tools))
    if len(found) > 1:
        raise bad_request(f"{found[0][0]} and {found[1][0]} cannot be combined: a request has one output constraint",
                          param=found[1][0])
    return found[0][1] if found else None


def _response_format(rf: dict[str, Any]) -> StructuredOutputsParams | None:
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind != "json_schema":
        raise bad_request(f"response_format.type must be text, json_object or json_schema, got {kind!r}",
                          param="response_format")
    js = rf.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
        raise bad_request("response_format.json_schema.schema must be a JSON Schema object", param="response_format")
    schema = js["schema"]
    if not js.get("strict"):  # ignore what the grammar engine does not implement, as OpenAI does
        schema = copy.copy(schema)
        schema["x-guidance"] = {**schema.get("x-guidance", {}), "lenient": True}
    try:
        return StructuredOutputsParams(json=schema)
    except ValueError as exc:
        raise bad_request(str(exc), param="response_format") from None


async def compile_constraint(ctx: ServeContext, spec: StructuredOutputsParams, param: str) -> None:
    """Compile ``spec`` in a grammar worker within the bounds' timeout; a 400 naming ``param``."""
    compiler = ctx.engine.grammar
    if compiler is None:
        raise bad_request("structured outputs need the model's tokenizer (tokenizer.json)", param=param)
    loop = asyncio.get_running_loop()
    timeout = compiler.bounds.compile_timeout_s
    try:
        await asyncio.wait_for(loop.run_in_executor(ctx.grammar_workers, compiler.compile, spec), timeout)
    except TimeoutError:
        raise bad_request(f"compiling the {spec.kind} constraint took longer than {timeout:g} s", param=param) from None
    except ValueError as exc:
        raise bad_request(str(exc), param=param) from None
