"""Benchmark find-batch-size --race as a user runs it: its cost, and its answer against a ground truth.

Runs `catsdogs find-batch-size --race` on prepared data once per `--seeds` value (each a fresh --out,
the noise scale's seed and so the race's seeds too), and prints per run: the race's seconds and the
whole command's, its trials, the target, where the trials' time went size by size (and the store's
folder, kept for reading afterwards), the measured fastest with its interval, the arms it cannot
tell apart, and the prediction's recommendation with its verdict.

With `--critical OUT` (the results store of `catsdogs sweep --config critical`, or a run of it on
these data and this backend, at the same target), each answer is held against the critical plan's
measured times: per batch size, the median over seeds of the steps to the target at its best rate
times the race's own steady step time of that size (the same device and run; for a size the race
did not train, its probe's scaled as the race scales its own: `step_times`), and the answer's T over the least: the target is at most 1.25 in each run,
with the 95% interval the critical plan's own few seeds leave that ratio (a median of 5 seeds at a
log sd of 0.4-1.1 moves by 25-60%). Sizes the critical plan did not train are said, not guessed.

    python benchmarks/bench_race.py --data-dir data/beyond --opt sgd --seeds 0 1 2 --until val_loss=0.49
    python benchmarks/bench_race.py --data-dir data/beyond --opt adam --seeds 0 --critical /tmp/crit
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import HERE

sys.path.insert(0, str(HERE))


def critical_times(store_out: Path, optimizer: str, steady: dict[str, float]) -> dict[int, float]:
    """{batch size: median steps to the target at its best rate x the race's steady step time}."""
    from catsdogs.analysis.to_target import best_rate_steps

    return {b: s * steady[str(b)] for b, s in best_rate_steps(_critical(store_out, optimizer)).items()
            if str(b) in steady and math.isfinite(s)}


def step_times(answer: dict) -> dict[str, float]:
    """Each size's steady seconds a step: the race's own, and for a size it did not train (the
    critical plan's 32 where the grid skips it) its probe's times the median ratio of the two over
    the sizes raced, as the race scales its own (0.31.0's runs: steady/probe 0.92-1.32 by run; the
    probe's bare time beside the race's steady ones moved T(answer)/T(best) by as much)."""
    import statistics

    probe = {str(r["batch_size"]): r["step_seconds"] for r in answer["recommendation"]["table"]}
    steady = answer["race"]["steady_step_seconds"]
    scale = statistics.median(steady[b] / probe[b] for b in steady if probe.get(b))
    return {**{b: t * scale for b, t in probe.items()}, **steady}


def truth_spread(store_out: Path, optimizer: str, a: int, b: int) -> tuple[float, float] | None:
    """The 95% interval of T(a)/T(b) from the critical plan's own seeds alone (each size's median
    steps over n seeds with log sd s: about 1.25 s / sqrt(n) in log, the median's standard error):
    how far its few seeds let the truth itself move. None where a spread is not known."""
    from catsdogs.analysis.to_target import tables

    rows = {r["batch_size"]: r for t in tables(_critical(store_out, optimizer)) for r in t["rows"]}
    if a not in rows or b not in rows or not rows[a]["log_sd"] or not rows[b]["log_sd"]:
        return None
    se = math.hypot(*(1.2533 * rows[k]["log_sd"] / math.sqrt(rows[k]["seeds"]) for k in (a, b)))
    return math.exp(-1.96 * se), math.exp(1.96 * se)


def _critical(store_out: Path, optimizer: str) -> list[dict]:
    from catsdogs.store import Store, store_path

    with Store(store_path(store_out), read_only=True) as store:
        return [t for t in store.trials("critical") if t["config"]["optimizer"] == optimizer]


def by_size(out: Path, sweep: str) -> str:
    """Where the race's trial time went, size by size, from its store: trials, wall seconds, and how
    many reached the target."""
    from catsdogs.store import Store, store_path

    with Store(store_path(out), read_only=True) as store:
        rows = store.trials(sweep)
    sizes: dict[int, list] = {}
    for r in rows:
        n = sizes.setdefault(r["config"]["batch_size"], [0, 0.0, 0])
        n[0], n[1], n[2] = n[0] + 1, n[1] + (r.get("wall_seconds") or 0.0), n[2] + bool(r.get("target_reached"))
    return "; ".join(f"{b}: {n} trials, {w:.0f} s, {k} reached" for b, (n, w, k) in sorted(sizes.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--opt", default="sgd")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--until", default=None, help="the race's target (default: its reference run's)")
    ap.add_argument("--critical", type=Path, default=None, help="a critical plan's --out, its ground truth")
    ap.add_argument("--extra", default="", help="more find-batch-size options")
    args = ap.parse_args()
    ratios = []
    for seed in args.seeds:
        out = Path(tempfile.mkdtemp(prefix=f"race-{seed}-"))
        command = [sys.executable, "-m", "catsdogs", "find-batch-size", "--data-dir", args.data_dir, "--out", str(out),
                   "--opt", args.opt, "--seed", str(seed), "--race", *(["--until", args.until] if args.until else []),
                   *args.extra.split()]
        t0 = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode:
            print(f"seed {seed}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
            continue
        answer = json.loads((out / "find-batch-size" / "find_batch_size.json").read_text())
        race = answer["race"]
        d, p = race["decision"], race["prediction"] or {}
        print(f"seed {seed}: command {wall:.0f} s, race {race['seconds']:.0f} s, {race['trials']} trials, "
              f"target {race['target']} ({race['target_said']})")
        print(f"  by size: {by_size(out, race['sweep'])} (the store: {out})")
        if d is None:
            print("  no measured answer")
            continue
        print(f"  fastest {d['batch_size']} at {d['lr']:g}: {d['seconds']:.2f} s ({d['seconds_low']:.2f}-"
              f"{d['seconds_high'] or math.inf:.2f}); tied {[t['batch_size'] for t in d['tied']]}; prediction "
              f"{p.get('batch_size')} {'agrees' if p.get('agrees') else 'ratio ' + str(p.get('ratio'))}")
        if args.critical:
            truth = critical_times(args.critical, args.opt, step_times(answer))
            if d["batch_size"] in truth:
                ratio = truth[d["batch_size"]] / min(truth.values())
                ratios.append(ratio)
                best = min(truth, key=truth.get)
                moves = truth_spread(args.critical, args.opt, d["batch_size"], best)
                said = f"; the truth's own seeds let it lie in {ratio * moves[0]:.2f}-{ratio * moves[1]:.2f}" if moves else ""
                print(f"  against the critical plan: T({d['batch_size']}) / T(best {best}) = {ratio:.2f} (target <= 1.25"
                      f"{said})")
            else:
                print(f"  the critical plan did not train {d['batch_size']}: its sizes are {sorted(truth)}")
    if ratios:
        print(f"ratios {', '.join(f'{r:.2f}' for r in ratios)}: {'met' if max(ratios) <= 1.25 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
