"""PD after both sides switched weights: the decode side's cached handshake with the prefill side
named the old weights; its first load after the switch asks again instead of failing (a PD fleet's
rolling update switches every replica, and a decode replica keeps its handshakes)."""

from __future__ import annotations

from test_pd_inprocess import engine, handoff, prompt, run


def test_first_load_after_both_sides_switched_weights_transfers(moe_dir, moe_dir_other_weights):
    p, d = engine(moe_dir, "kv_producer"), engine(moe_dir, "kv_consumer")  # policy "fail": no silent recompute
    try:
        ids = prompt(7, 70)
        _, kv = handoff(p, ids)
        assert run(d, ids, kv=kv).prompt_token_sources["transferred"] == 64  # D now holds P's handshake
        for e in (p, d):
            e.update_weights(str(moe_dir_other_weights), "v1", "drain")
        assert p.provenance.weights_version == d.provenance.weights_version == "user:v1"
        ids = prompt(8, 70)
        _, kv = handoff(p, ids)
        out = run(d, ids, kv=kv)
        assert out.error is None, out.error
        assert out.prompt_token_sources == {"local_cache": 0, "offloaded": 0, "transferred": 64, "computed": 6}
        single = run(engine(moe_dir_other_weights), ids)
        assert out.outputs[0].token_ids == single.outputs[0].token_ids and len(single.outputs[0].token_ids) == 8
    finally:
        p.pd.close()
        d.pd.close()
