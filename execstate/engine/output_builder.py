"""Stop conditions and the one place that turns a Request into a RequestOutput."""

from __future__ import annotations

from execstate.engine.outputs import CompletionOutput, Logprob, RequestOutput
from execstate.engine.request import Request, RequestStatus
from execstate.engine.tokenizer import Tokenizer


def _text(req: Request, tokenizer: Tokenizer | None) -> str:
    if tokenizer is None:
        return ""
    return tokenizer.decode(req.output_token_ids, skip_special_tokens=req.params.skip_special_tokens)


def check_stop(req: Request, eos_token_ids: set[int], tokenizer: Tokenizer | None) -> RequestStatus | None:
    """Decide whether the request stops after its newest token (sets stop_reason)."""
    p = req.params
    token = req.output_token_ids[-1]
    n_out = len(req.output_token_ids)
    if n_out >= p.min_tokens:
        if not p.ignore_eos and token in eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if p.stop_token_ids and token in p.stop_token_ids:
            req.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
        if p.stop and tokenizer is not None:
            text = _text(req, tokenizer)
            for s in p.stop:
                if s in text:
                    req.stop_reason = s
                    return RequestStatus.FINISHED_STOPPED
    if n_out >= req.max_new_tokens or req.num_tokens >= req.max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None


def build_output(req: Request, tokenizer: Tokenizer | None, return_routes: bool) -> RequestOutput:
    p = req.params
    text = _text(req, tokenizer)
    if isinstance(req.stop_reason, str):
        text = text[: text.find(req.stop_reason)] if req.stop_reason in text else text
    logprobs = None
    cumulative = None
    if p.logprobs is not None:
        logprobs = []
        for tok, lp, top in zip(req.output_token_ids, req.output_logprobs, req.output_top_logprobs, strict=True):
            entry = {tok: Logprob(lp, 1 + sum(1 for _, v in top if v > lp), _decode_one(tokenizer, tok))}
            for rank, (alt, v) in enumerate(top, start=1):
                if alt != tok:
                    entry[alt] = Logprob(v, rank, _decode_one(tokenizer, alt))
            logprobs.append(entry)
        cumulative = float(sum(req.output_logprobs))
    routes = None
    finished = req.is_finished
    served = finished and req.status is not RequestStatus.FINISHED_ABORTED and req.output_token_ids
    # A PD prefill's routes travel with its KV to the decode side, never through the proxy.
    served = served and not (req.kv_transfer_params or {}).get("do_remote_decode")
    if return_routes and req.routes is not None and served:
        routes = req.routes.result(req.num_tokens, p.routed_experts_prompt_start)
    completion = CompletionOutput(
        index=0,
        text=text,
        token_ids=list(req.output_token_ids),
        cumulative_logprob=cumulative,
        logprobs=logprobs,
        finish_reason=req.finish_reason,
        stop_reason=req.stop_reason,
        routed_experts=routes,
    )
    metrics = {"num_preemptions": float(req.num_preemptions)}
    if req.first_token_time is not None:
        metrics["ttft_s"] = req.first_token_time - req.arrival_time
    return RequestOutput(
        request_id=req.request_id,
        prompt=req.prompt,
        prompt_token_ids=list(req.prompt_token_ids),
        outputs=[completion],
        finished=finished,
        num_cached_tokens=req.num_cached_tokens or 0,
        metrics=metrics,
        prompt_token_sources=_sources(req),
        kv_transfer_params=req.kv_transfer_out,
        error=req.abort_message,
    )


def _sources(req: Request) -> dict[str, int]:
    local = min(req.num_cached_tokens or 0, req.num_prompt_tokens)
    moved = min(req.num_transferred_tokens, req.num_prompt_tokens - local)
    return {"local_cache": local, "transferred": moved, "computed": req.num_prompt_tokens - local - moved}


def _decode_one(tokenizer: Tokenizer | None, token_id: int) -> str | None:
    return tokenizer.decode([token_id], skip_special_tokens=False) if tokenizer is not None else None
