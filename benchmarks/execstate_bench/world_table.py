"""A readable table of ``execstate bench world``'s report (``execstate_bench/world.py``)."""

from __future__ import annotations

from typing import Any

_ROWS = {
    "latency": [("first_chunk_ms", "time to first chunk (open + first step), ms"), ("step_ms_p50", "step p50, ms"),
                ("step_ms_p99", "step p99, ms"), ("chunks_per_s", "chunks/s (sustained)"),
                ("frames_per_s", "frames/s (sustained)")],
    "events": [("events", "events measured"), ("event_to_action_ms_p50", "event -> action p50, ms"),
               ("event_to_action_ms_p99", "event -> action p99, ms"),
               ("steps_to_action_max", "steps to action, max")],
    "checkpoint": [("at_step", "state at step"), ("checkpoint_ms_p50", "checkpoint, ms"),
                   ("rollback_ms_p50", "rollback, ms"), ("recompute_ms_p50", "recompute the same state, ms"),
                   ("rollback_speedup", "rollback speed-up vs recompute"),
                   ("rollback_reproduces_frames", "rollback reproduces frames bit for bit")],
    "compiled": [("eager_step_ms_p50", "eager step p50, ms"), ("compiled_step_ms_p50", "compiled step p50, ms"),
                 ("compiled_first_step_ms", "compiled first step (compile), ms"),
                 ("kv_max_diff", "max |K/V eager - compiled| over all steps"),
                 ("frame_max_diff_levels", "max frame difference, uint8 levels"),
                 ("state_keys_differ", "state keys differ (numerics in provenance)")],
    "memory": [("steps", "steps"), ("blocks_in_use_min_after_fill", "K/V blocks in use, min after window fill"),
               ("blocks_in_use_max_after_fill", "K/V blocks in use, max after window fill"),
               ("kv_bytes_in_use", "K/V bytes in use"), ("rss_mb_at_50", "resident memory at step 50, MB")],
    "quality": [("action_accuracy", "action-following accuracy"),
                ("action_accuracy_when_moving", "accuracy on frames where the agent moves"),
                ("psnr_mean_first", "PSNR, first 8 steps, dB"), ("psnr_mean_all", "PSNR, all steps, dB")],
}


def format_world_table(report: dict[str, Any]) -> str:
    head = (f"world bench: model {report['model']} ({report['weights_version']}), frames "
            f"{'x'.join(map(str, report['frame_shape']))}, F={report['frames_per_chunk']}, "
            f"{report['threads']} threads on {report['cpus']} CPUs, load {report['load_start']} -> "
            f"{report['load_end']}, {report['wall_s']} s")
    lines = [head]
    for part, rows in _ROWS.items():
        if part not in report:
            continue
        lines.append(f"\n[{part}]")
        data = report[part]
        for key, label in rows:
            lines.append(f"  {label:<52} {data.get(key)}")
        for key in data:
            if key.startswith("rss_mb_at_") and key != "rss_mb_at_50":
                lines.append(
                    f"  {'resident memory at step ' + key.removeprefix('rss_mb_at_') + ', MB':<52} {data[key]}"
                )
    if "serve" in report:
        lines.append("\n[serve] (over the socket; per run: frames/s and first chunks of each session)")
        for run in report["serve"]["runs"]:
            target = "as fast as possible" if not run["fps_target"] else f"{run['fps_target']:g} fps"
            lines.append(f"  {run['sessions']} session(s), {target}, {run['step_workers']} step worker(s), "
                         f"{run['seconds']:g} s: frames/s each {run['frames_per_s_each']}; first chunk ms "
                         f"{run['first_chunk_ms']}, first generated chunk ms {run['first_generated_chunk_ms']}; "
                         f"step p50 {run['step_ms_p50']} ms, p99 {run['step_ms_p99']} ms; "
                         f"behind at most {run['behind_ms_max']} ms; load {run['load_before']} -> {run['load_after']}")
    return "\n".join(lines)
