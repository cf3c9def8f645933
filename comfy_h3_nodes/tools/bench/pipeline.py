"""``bench pipeline`` and ``bench warm``: N requests through the real executor with stand-in stage costs, pipelined
versus one at a time (next to the ideal ``fill + (N-1) x slower machine``), and a first versus a second request (the
second must load nothing)."""

from __future__ import annotations

import time

from .common import DEFAULT_SYNTHETIC, GOALS, _busy, _make_executor, _median, _request, _stage_medians, tiny_checkpoint


def run_pipeline(requests: int = 8, in_flight: tuple[int, ...] = (2, 3), synthetic: dict | None = None,
                 ckpt=None, log=print) -> dict:
    synthetic = dict(DEFAULT_SYNTHETIC if synthetic is None else synthetic)
    ckpt = ckpt or tiny_checkpoint()
    ex = _make_executor(ckpt, "pipe", synthetic, max_in_flight=max(in_flight))
    seq = None
    try:
        t0 = time.perf_counter()
        ex.start()
        start_s = time.perf_counter() - t0
        ex.generate(_request(900))  # warm: lazy pipelines built, nothing measured
        seq = _make_executor(ckpt, "pipe", synthetic, max_in_flight=1)  # the same resident actors, one at a time
        seq.start()
        t0 = time.perf_counter()
        seq_results = seq.run_many([_request(i) for i in range(requests)])
        seq_makespan = time.perf_counter() - t0
        busy = [_busy(r.records) for r in seq_results]
        t_a, t_b = _median([x["A"] for x in busy]), _median([x["B"] for x in busy])
        fill = seq_makespan / requests  # one request alone, end to end, as the executor runs it
        ideal = fill + (requests - 1) * max(t_a, t_b)
        nominal_fill = synthetic.get("encode", 0) + synthetic.get("denoise", 0) + synthetic.get("decode", 0)
        nominal_ideal = nominal_fill + (requests - 1) * max(synthetic.get("encode", 0) + synthetic.get("decode", 0),
                                                            synthetic.get("denoise", 0))
        runs = {}
        for k in in_flight:
            ex.set_max_in_flight(k)
            ex.max_seen_in_flight = 0
            t0 = time.perf_counter()
            results = ex.run_many([_request(100 * k + i) for i in range(requests)])
            makespan = time.perf_counter() - t0
            den = sorted((r for res in results for r in res.records if r.stage in ("a_to_b", "denoise")),
                         key=lambda r: r.start)
            b_busy = sum(_busy(res.records)["B"] for res in results)
            b_span = max(r.end for r in den) - min(r.start for r in den)
            runs[str(k)] = {
                "max_in_flight": k,
                "makespan_s": round(makespan, 3),
                "ratio_vs_ideal": round(makespan / ideal, 3),
                "ratio_vs_b_bound": round(makespan / (fill + (requests - 1) * t_b), 3),
                "speedup_vs_sequential": round(seq_makespan / makespan, 3),
                "max_seen_in_flight": ex.max_seen_in_flight,
                "b_utilisation": round(b_busy / b_span, 3) if b_span > 0 else None,
                "stage_medians_s": _stage_medians(results),
            }
        out = {
            "bench": "pipeline", "requests": requests, "synthetic_s": synthetic, "actor_start_s": round(start_s, 2),
            "sequential_makespan_s": round(seq_makespan, 3), "fill_s": round(fill, 4),
            "a_per_request_s": round(t_a, 4), "b_per_request_s": round(t_b, 4), "ideal_s": round(ideal, 3),
            "nominal_ideal_s": round(nominal_ideal, 3), "nominal_sequential_s": round(requests * nominal_fill, 3),
            "sequential_stage_medians_s": _stage_medians(seq_results), "runs": runs,
        }
        best = runs[str(min(in_flight))]
        out["goal_met"] = {"makespan_vs_ideal": best["ratio_vs_ideal"] <= GOALS["makespan_vs_ideal"],
                           "speedup_vs_sequential": best["speedup_vs_sequential"] >= GOALS["speedup_vs_sequential"]}
        log(format_pipeline(out))
        return out
    finally:
        if seq is not None:
            seq._loop.stop()  # shares ex's actors: only its loop thread is its own
        ex.shutdown(kill_b=True)


def format_pipeline(out: dict) -> str:
    s = out["synthetic_s"]
    lines = [
        f"pipeline: {out['requests']} requests, tiny model + synthetic stages encode {s.get('encode', 0)} s, "
        f"denoise {s.get('denoise', 0)} s, decode {s.get('decode', 0)} s",
        f"  per request, measured one at a time: A busy {out['a_per_request_s']:.3f} s (encode + receive + decode), "
        f"B busy {out['b_per_request_s']:.3f} s (receive + denoise), end to end {out['fill_s']:.3f} s",
        f"  sequential (max_in_flight=1): {out['sequential_makespan_s']:.3f} s "
        f"(nominal {out['nominal_sequential_s']:.3f} s)",
        f"  ideal = fill + (N-1) x slower machine = {out['ideal_s']:.3f} s (nominal {out['nominal_ideal_s']:.3f} s)",
        "  (A runs encode and decode in two concurrency groups, so A's two stages may overlap and a makespan a little "
        "under the ideal is possible when A measures slower; /B-bound uses B's time alone)",
        f"  {'in flight':>9} {'makespan':>9} {'/ideal':>7} {'/B-bound':>8} {'speedup':>8} {'B util':>7}",
    ]
    for r in out["runs"].values():
        lines.append(f"  {r['max_in_flight']:9d} {r['makespan_s']:9.3f} {r['ratio_vs_ideal']:7.3f} "
                     f"{r['ratio_vs_b_bound']:8.3f} {r['speedup_vs_sequential']:8.3f} {r['b_utilisation'] or 0:7.3f}")
    lines.append(f"  goals (default max_in_flight): makespan <= {GOALS['makespan_vs_ideal']} x ideal "
                 f"{'met' if out['goal_met']['makespan_vs_ideal'] else 'NOT met'}; speedup >= "
                 f"{GOALS['speedup_vs_sequential']} {'met' if out['goal_met']['speedup_vs_sequential'] else 'NOT met'}")
    return "\n".join(lines)


def run_warm(ckpt=None, log=print) -> dict:
    ckpt = ckpt or tiny_checkpoint()
    ex = _make_executor(ckpt, "warm")
    try:
        t0 = time.perf_counter()
        ex.start()
        start_s = time.perf_counter() - t0
        loads0 = ex.load_records()
        rows = []
        for i in range(2):
            before = ex.load_records()
            t0 = time.perf_counter()
            res = ex.generate(_request(500 + i, steps=3, size=64))
            wall = time.perf_counter() - t0
            after = ex.load_records()
            new = {side: after[side][len(before[side]):] for side in after}
            swap = sum(r.load_s for r in res.records)
            rows.append({
                "wall_s": round(wall, 4),
                "load_s": round(sum(r.seconds for recs in new.values() for r in recs) + swap, 4),
                "loads": sum(len(v) for v in new.values()),
                "stages_s": {k: round(v, 4) for k, v in res.stage_seconds().items()},
            })
        out = {
            "bench": "warm", "actor_start_s": round(start_s, 2),
            "startup_load_s": {side: round(sum(r.seconds for r in recs), 3) for side, recs in loads0.items()},
            "startup_loads": {side: [r.component for r in recs] for side, recs in loads0.items()},
            "first": rows[0], "second": rows[1],
            "goal_met": rows[1]["load_s"] == GOALS["warm_load_s"] and rows[1]["loads"] == 0,
        }
        lines = [f"warm: actors started in {out['actor_start_s']:.2f} s; loads at start A "
                 f"{out['startup_load_s'].get('A', 0):.3f} s, B {out['startup_load_s'].get('B', 0):.3f} s",
                 f"  {'request':8} {'wall s':>8} {'loads':>6} {'load s':>7}  stages"]
        for label, r in (("first", rows[0]), ("second", rows[1])):
            lines.append(f"  {label:8} {r['wall_s']:8.3f} {r['loads']:6d} {r['load_s']:7.3f}  "
                         + " ".join(f"{k}={v:.3f}" for k, v in r["stages_s"].items()))
        lines.append(f"  goal: second request loads nothing: {'met' if out['goal_met'] else 'NOT met'}")
        log("\n".join(lines))
        return out
    finally:
        ex.shutdown(kill_b=True)
