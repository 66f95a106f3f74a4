"""Weight updates of a running engine (rules: ``engine/weight_update.py``), the part of
``LLMEngine`` that switches weights in place.

Contract: ``update_weights`` / ``begin_weight_update`` validate everything (policy, version,
every tensor's name, dtype and shape) before the first copy, so a ``ValueError`` changes
nothing. The switch itself happens when the requests in flight are gone: at once for
``abort`` (they are finished with finish_reason ``"abort"``), after they finish on the old
weights for ``drain`` (``LLMEngine.step``/``poll`` call ``_switch_weights_if_drained``). The
new weights version goes into the provenance, so no block computed before the switch can be
hit after it; a session step that was held back by the drain and holds old blocks is aborted.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from execstate.engine.outputs import RequestOutput
from execstate.engine.request import RequestStatus
from execstate.engine.weight_update import UpdatePolicy, WeightUpdate, check_policy, supplied_version
from execstate.model.loader import load_hf_state_dict
from execstate.model.weight_copy import plan_weight_copy
from execstate.model.weights_digest import model_digest

if TYPE_CHECKING:
    from execstate.engine.llm_engine import LLMEngine


class EngineWeights:
    """Mixed into ``LLMEngine`` (whose state it uses: model, requests, scheduler, provenance,
    kv_manager, pd, weight_update, _weights_versions, _finished_between_steps)."""

    def update_weights(
        self: LLMEngine, source: str | Path | dict[str, torch.Tensor], weights_version: str | None = None,
        policy: UpdatePolicy = "abort",
    ) -> list[RequestOutput]:
        """Load new weights in place (``source``: a state dict with HF tensor names, or a
        checkpoint directory) and return the final outputs of the requests in flight:
        aborted (``policy="abort"``) or completed on the old weights (``"drain"``, which
        steps the engine until they finish). ``weights_version``: see ``begin_weight_update``.
        """
        update = self.begin_weight_update(source, weights_version, policy)
        outputs = list(update.aborted)
        while not update.done:
            outputs += [o for o in self.step() if o.finished]
            self.poll()
        return outputs

    def begin_weight_update(
        self: LLMEngine, source: str | Path | dict[str, torch.Tensor], weights_version: str | None = None,
        policy: UpdatePolicy = "abort",
    ) -> WeightUpdate:
        """Start a weight update (rules: ``engine/weight_update.py``); complete when the
        returned update is ``done``: at once for ``abort`` (outputs in ``update.aborted``),
        for ``drain`` once the requests in flight finish (``step``/``poll`` switch; the
        state dict's tensors are read then: leave them unchanged until ``done``). A
        ``ValueError`` (policy, version, any tensor's name/dtype/shape) changes nothing."""
        if self.weight_update is not None:
            raise RuntimeError("a weight update is already in progress")
        policy = check_policy(policy)
        version = supplied_version(weights_version, self._weights_versions)
        state_dict = load_hf_state_dict(Path(source)) if isinstance(source, str | Path) else source
        update = WeightUpdate(plan_weight_copy(self.model, state_dict), version, policy)
        if policy == "abort":
            for req in list(self.requests.values()):
                self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
                req.abort_message = "aborted by a weight update"
                update.aborted.append(self._finalize(req))
        else:
            update.waits_for = list(self.requests.values())
            self.scheduler.admit_only = set(update.waits_for)
        self.weight_update = update
        self._switch_weights_if_drained()
        return update

    def _switch_weights_if_drained(self: LLMEngine) -> None:
        update = self.weight_update
        if update is None or not update.drained:
            return
        t0 = time.perf_counter()
        update.plan.apply()
        version = update.version or model_digest(self.model)
        self.provenance = replace(self.provenance, weights_version=version)
        self.kv_manager.set_provenance(self.provenance)
        for req in list(self.requests.values()):  # held back by the drain: never admitted
            if req.block_ids:  # a session step holding KV of the old weights: it cannot go on
                req.abort_message = "the weights were updated before this step started: its state is stale"
                self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
                self._finished_between_steps.append(self._finalize(req))  # returned by the next step()
                continue
            req.block_keys = []  # keys from the new root
        self.scheduler.admit_only = None
        self._weights_versions.add(version)
        self.weight_update = None
        if self.pd is not None:
            self.pd.on_weights_updated()
        update.finish(version, time.perf_counter() - t0)
