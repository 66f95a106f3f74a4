"""Stop conditions and the one place that turns a Request into a RequestOutput.

Per-token cost is O(1) in the output length (docs/contracts.md 8):

- ``on_new_token`` runs once for each sampled token: it decodes the token into the
  request's text (``Request.output``, ``engine/output_state.py``: incremental), builds the token's logprob entry
  (once; never rebuilt) and decides whether the request stops: EOS, a stop token id, a
  stop string (searched in the newest characters only), or the length limit, in that
  order of precedence. EOS and stop ids count only from the ``min_tokens``-th token on;
  so do stop strings, which must end in text that token or a later one produced.
- ``build_output`` costs O(what the output carries), by ``params.output_kind``:
  ``DELTA``: the tokens, entries and text since the previous output; ``FINAL_ONLY``
  (called only once finished) and a finished ``CUMULATIVE``: everything, the token ids
  sliced once from the request's token list, the entries as the request's own list (a
  finished request never changes again); an unfinished ``CUMULATIVE``: copies of
  everything so far (the consumer may read them on another thread while the engine
  appends), O(length) because that is what it returns.
"""

from __future__ import annotations

from execstate.engine.outputs import CompletionOutput, Logprob, RequestOutput
from execstate.engine.request import Request, RequestStatus
from execstate.engine.sampling_params import RequestOutputKind
from execstate.engine.tokenizer import Tokenizer


def on_new_token(req: Request, eos_token_ids: set[int], tokenizer: Tokenizer | None) -> RequestStatus | None:
    """Take in the request's newest token; the status it finishes with, or None (sets stop_reason)."""
    p, o = req.params, req.output
    token = req.all_token_ids[-1]
    logprob = o.logprobs[-1]
    o.cumulative_logprob += float(logprob)
    if p.logprobs is not None:
        o.logprob_entries.append(_entry(tokenizer, token, logprob, o.top_logprobs[-1]))
    new_chars = o.detok.add_token(tokenizer, token)
    n_out = req.num_output_tokens
    may_stop = n_out >= p.min_tokens
    if may_stop and not p.ignore_eos and token in eos_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if may_stop and p.stop_token_ids and token in p.stop_token_ids:
        req.stop_reason = token
        return RequestStatus.FINISHED_STOPPED
    at_length = n_out >= req.max_new_tokens or req.num_tokens >= req.max_model_len
    if at_length:  # the last token: decode what an incomplete character held back
        new_chars += o.detok.finish(tokenizer)
    if may_stop and p.stop:
        stop = o.detok.find_stop(new_chars) if new_chars else o.detok.find_stop_held_back(tokenizer)
        if stop is not None:
            req.stop_reason = stop
            return RequestStatus.FINISHED_STOPPED
    return RequestStatus.FINISHED_LENGTH if at_length else None


def build_output(req: Request, tokenizer: Tokenizer | None, return_routes: bool) -> RequestOutput:
    p, o = req.params, req.output
    finished = req.is_finished
    if finished:
        o.detok.finish(tokenizer)  # no-op unless it finished without a last token (abort, EOS)
    wants_logprobs = p.logprobs is not None
    entries: list[dict[int, Logprob]] | None
    if p.output_kind is RequestOutputKind.DELTA:
        start, o.num_sent_tokens = o.num_sent_tokens, req.num_output_tokens
        token_ids = req.output_token_ids[start:]
        entries = o.logprob_entries[start:] if wants_logprobs else None
        text = o.detok.take_delta(finished)
    else:
        token_ids = req.output_token_ids[:]  # a slice of the request's token list
        entries = o.logprob_entries if finished else list(o.logprob_entries)
        entries = entries if wants_logprobs else None
        text = o.detok.text(finished)
    routes = None
    served = finished and req.status is not RequestStatus.FINISHED_ABORTED and req.num_output_tokens > 0
    # A PD prefill's routes travel with its KV to the decode side, never through the proxy.
    served = served and not (req.transfer.params or {}).get("do_remote_decode")
    if return_routes and req.routes is not None and served:
        routes = req.routes.result(req.num_tokens, p.routed_experts_prompt_start)
    completion = CompletionOutput(
        index=0,
        text=text,
        token_ids=token_ids,
        cumulative_logprob=o.cumulative_logprob if wants_logprobs else None,
        logprobs=entries,
        finish_reason=req.finish_reason,
        stop_reason=req.stop_reason,
        routed_experts=routes,
    )
    scoring = req.prompt_scoring
    first_delta = p.output_kind is RequestOutputKind.DELTA and o.num_sent_tokens == len(token_ids)
    once = p.output_kind is not RequestOutputKind.DELTA or first_delta  # a DELTA request: its first output
    plp = scoring.result() if scoring is not None and once and scoring.complete else None
    metrics = {"num_preemptions": float(req.num_preemptions)}
    if req.first_token_time is not None:
        metrics["ttft_s"] = req.first_token_time - req.arrival_time
        metrics["first_token_time"] = req.first_token_time
    return RequestOutput(
        request_id=req.request_id,
        prompt=req.prompt,
        prompt_token_ids=req.prompt_token_ids,  # never mutated: shared, not copied
        outputs=[completion],
        finished=finished,
        num_cached_tokens=req.num_cached_tokens or 0,
        metrics=metrics,
        prompt_token_sources=_sources(req),
        kv_transfer_params=req.transfer.out,
        error=req.abort_message,
        prompt_logprobs=plp,
    )


def _entry(
    tokenizer: Tokenizer | None, token: int, logprob: float, top: list[tuple[int, float]]
) -> dict[int, Logprob]:
    """One token's logprob entry: the sampled token (ranked among the alternatives) first."""
    entry = {token: Logprob(logprob, 1 + sum(1 for _, v in top if v > logprob), _decode_one(tokenizer, token))}
    for rank, (alt, v) in enumerate(top, start=1):
        if alt != token:
            entry[alt] = Logprob(v, rank, _decode_one(tokenizer, alt))
    return entry


def _sources(req: Request) -> dict[str, int]:
    local = min(req.num_cached_tokens or 0, req.num_prompt_tokens)
    offloaded = min(req.num_offloaded_tokens, req.num_prompt_tokens - local)
    moved = min(req.num_transferred_tokens, req.num_prompt_tokens - local - offloaded)
    return {"local_cache": local, "offloaded": offloaded, "transferred": moved,
            "computed": req.num_prompt_tokens - local - offloaded - moved}


def _decode_one(tokenizer: Tokenizer | None, token_id: int) -> str | None:
    return tokenizer.decode([token_id], skip_special_tokens=False) if tokenizer is not None else None
