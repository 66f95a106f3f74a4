"""Weight updates of a running engine (rules: ``engine/weight_update.py``): :class:`EngineWeights`
switches the weights in place.

Contract: ``begin`` validates everything (policy, version, every tensor's name, dtype and
shape) before the first copy, so a ``ValueError`` changes nothing. For ``abort`` it finishes
every request in flight (finish_reason ``"abort"``, outputs in ``update.aborted``); for
``drain`` it holds admission to the requests in flight. The switch itself
(``switch_if_drained``) happens once the requests it waits for are gone: the engine calls it
right after ``begin`` and then from every ``step``/``poll``. The new weights version goes into
the provenance (``KVCacheManager.set_provenance``), so no block computed before the switch can be
hit after it; a session step that was held back by the drain and holds old blocks is aborted
(its output is deferred to the next step). Switch listeners (``on_switch``, given at construction:
the PD connector's) run after the provenance changed and before the update is finished.

Built by ``LLMEngine`` with the model, the live requests, the scheduler, the KV cache manager,
the request finisher and the switch listeners. Threads: the engine thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from execstate.engine.finisher import RequestFinisher
from execstate.engine.kv_cache_manager import KVCacheManager
from execstate.engine.request import Request, RequestStatus
from execstate.engine.scheduler import Scheduler
from execstate.engine.weight_update import UpdatePolicy, WeightUpdate, check_policy, supplied_version
from execstate.model.loader import load_hf_state_dict
from execstate.model.transformer import CausalLM
from execstate.model.weight_copy import plan_weight_copy
from execstate.model.weights_digest import model_digest


class EngineWeights:
    """The engine's weights and their updates (module docstring)."""

    def __init__(self, model: CausalLM, requests: Mapping[str, Request], scheduler: Scheduler,
                 kv_manager: KVCacheManager, finisher: RequestFinisher,
                 on_switch: Sequence[Callable[[], None]] = ()) -> None:
        self._model = model
        self._requests = requests
        self._scheduler = scheduler
        self._kv_manager = kv_manager
        self._finisher = finisher
        self._versions = {kv_manager.provenance.weights_version}  # every version this engine has run
        # called after every switch (new provenance bound, update not finished yet)
        self._listeners = tuple(on_switch)
        self.in_progress: WeightUpdate | None = None  # an update not switched yet (policy drain)

    def begin(self, source: str | Path | dict[str, torch.Tensor], weights_version: str | None,
              policy: UpdatePolicy) -> WeightUpdate:
        """Validate and start an update (module docstring); the caller then calls ``switch_if_drained``."""
        if self.in_progress is not None:
            raise RuntimeError("a weight update is already in progress")
        policy = check_policy(policy)
        version = supplied_version(weights_version, self._versions)
        state_dict = load_hf_state_dict(Path(source)) if isinstance(source, str | Path) else source
        update = WeightUpdate(plan_weight_copy(self._model, state_dict), version, policy)
        if policy == "abort":
            for req in list(self._requests.values()):
                self._scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
                req.abort_message = "aborted by a weight update"
                update.aborted.append(self._finisher.finalize(req))
        else:
            update.waits_for = list(self._requests.values())
            self._scheduler.admit_only = set(update.waits_for)
        self.in_progress = update
        return update

    def switch_if_drained(self) -> None:
        """Switch to the update's weights if one is in progress and nothing it waits for runs."""
        update = self.in_progress
        if update is None or not update.drained:
            return
        t0 = time.perf_counter()
        update.plan.apply()
        version = update.version or model_digest(self._model)
        self._kv_manager.set_provenance(replace(self._kv_manager.provenance, weights_version=version))
        for req in list(self._requests.values()):  # held back by the drain: never admitted
            if req.block_ids:  # a session step holding KV of the old weights: it cannot go on
                req.abort_message = "the weights were updated before this step started: its state is stale"
                self._scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
                self._finisher.defer(self._finisher.finalize(req))  # returned by the next step()
                continue
            req.cache.block_keys = []  # keys from the new root
        self._scheduler.admit_only = None
        self._versions.add(version)
        self.in_progress = None
        for listener in self._listeners:
            listener()
        update.finish(version, time.perf_counter() - t0)
