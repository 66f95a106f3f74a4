"""Agent configuration (``DuplexAgent``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from execstate.agent.end_probe import END_SCORES
from execstate.agent.turn_policy import TurnConfig
from execstate.tool_calls.parsers import PARSER_NAMES


@dataclass(frozen=True)
class AgentConfig:
    """``step_tokens``: tokens per front step (the interruption granularity); ``max_response_tokens``:
    generated tokens per response. The context is a transcript: user words after ``user_prefix``,
    the agent's replies after ``agent_prefix``, results as ``result_format``. ``speak_results``:
    ``"template"`` (a result response opens with ``result_template``, then the model continues:
    reliable with small models) or ``"model"`` (the model speaks from the appended result alone).
    ``cancel_tasks_on_barge_in``: interrupting the front also cancels open back-end tasks (off: they
    run on; their results come back stale). ``model_tool_calls``: parse tool calls in the front's
    output, in the format of ``tool_call_parser`` (``execstate/tool_calls/parsers.py``, the parser
    the OpenAI API uses too). ``chars_per_s``: the playback rate ``truncate(played_ms=...)`` converts with.
    ``speculative_prefill``: prefill the user's partial turns and score their end with the front
    (``agent/prefill.py``). ``end_score``: what scores the end of the user's turn: ``"auto"`` (the
    shipped end-of-turn probe on the front's hidden state when the front runs the model it was
    trained for, else the end tokens' mass), ``"probe"`` (the probe; an agent on another model is
    refused: ``agent/end_probe.py``), ``"mass"`` (the end tokens' probability mass).
    ``max_input_chars``: bound on one ``feed`` chunk; ``max_turn_chars``:
    bound on one user turn (the chunks not yet taken); ``max_events``: bound on undelivered events.
    (The back end's bounds, a task's time and the tasks running at once, are its own:
    ``backend.TaskLimits``.)"""

    turn: TurnConfig = field(default_factory=TurnConfig)
    step_tokens: int = 4
    max_response_tokens: int = 24
    user_prefix: str = "\nUser:"
    agent_prefix: str = "\nAgent:"
    result_format: str = "\n[{tool} result: {result}]"
    speak_results: str = "template"
    result_template: str = " The answer is {result}."
    cancel_tasks_on_barge_in: bool = False
    model_tool_calls: bool = True
    tool_call_parser: str = "hermes"
    chars_per_s: float = 15.0
    speculative_prefill: bool = True
    end_score: str = "auto"
    max_input_chars: int = 4096
    max_turn_chars: int = 16_384
    max_events: int = 10_000

    def __post_init__(self) -> None:
        for name in ("step_tokens", "max_response_tokens", "max_input_chars", "max_turn_chars", "max_events"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.speak_results not in ("template", "model"):
            raise ValueError(f"speak_results must be 'template' or 'model', got {self.speak_results!r}")
        if self.tool_call_parser not in PARSER_NAMES:
            raise ValueError(f"tool_call_parser must be one of {PARSER_NAMES}, got {self.tool_call_parser!r}")
        if self.end_score not in END_SCORES:
            raise ValueError(f"end_score must be one of {END_SCORES}, got {self.end_score!r}")
        if not self.chars_per_s > 0:
            raise ValueError("chars_per_s must be > 0")
