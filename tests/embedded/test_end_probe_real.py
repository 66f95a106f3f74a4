"""The shipped end-of-turn probe on the real front model (slow: smollm2-135m): it was trained for
these weights, and its held-out figures (the nine recorded voice bench runs, docs/voice.md)
reproduce from its file."""

from __future__ import annotations

import pytest

from execstate.agent import end_probe


@pytest.mark.slow
def test_the_probes_held_out_figures_reproduce_from_its_file(dense_dir):
    from execstate_bench import end_probe_train as ept

    probe = end_probe.shipped()
    front = ept.Front(str(dense_dir))
    assert front.weights_version == probe.weights_version
    report = ept.evaluate(front, probe.w, probe.b)
    assert (report["n_ends"], report["n_pauses"]) == (189, 68)
    assert round(report["auc_live_end_score"], 3) == 0.890
    assert round(report["auc_offline_end_mass"], 3) == 0.807
    assert round(report["auc_probe"], 3) == 0.904
    ends, pauses = report["at"]["0.5"]["probe"]
    assert (round(ends * 189), round(pauses * 68)) == (137, 0)  # 72.5 % of the turn ends, no pause
