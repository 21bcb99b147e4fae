"""One stage's part of the H100 run's summary.md, from what the stage wrote (scripts/h100.sh).

    python scripts/h100_summary.py reproduce --out RUNS --name h100-reproduce --seconds 143 --target 150 --label "..."
    python scripts/h100_summary.py profile --csv profile.csv [--torch torch.json] --label "..."
    python scripts/h100_summary.py find --json find_batch_size.json [--target 60] --label "..."

Prints Markdown; h100.sh appends it to $OUT/summary.md. Reads files only: no framework (catsdogs.gradient_noise
only for its wording, from the source tree).
"""

from __future__ import annotations

import argparse
import csv
import json
import sqlite3
import statistics
import sys
from pathlib import Path

from catsdogs.gradient_noise import NoiseEstimate, describe


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _num(v, fmt: str = ".2f") -> str:
    return "—" if v is None else format(v, fmt)


def reproduce(a) -> list[str]:
    with sqlite3.connect(Path(a.out) / "results.sqlite") as db:
        db.row_factory = sqlite3.Row
        rows = [dict(r) for r in db.execute(
            "SELECT t.* FROM trials t JOIN sweep_trials s ON s.key = t.key WHERE s.sweep = ?", (a.name,))]
    done = [r for r in rows if r["status"] == "done"]
    env = json.loads(done[0]["env"]) if done and done[0].get("env") else {}
    met = a.seconds <= a.target if a.target else None
    lines = [f"## {a.label}", "",
             f"- {len(done)} of {len(rows)} trials done"
             + "".join(f", {sum(r['status'] == s for r in rows)} {s}" for s in ("failed", "oom", "pending")
                       if any(r["status"] == s for r in rows)),
             f"- the command: {a.seconds:.0f} s" + (f" (target ≤ {a.target:.0f} s: {'met' if met else 'NOT met'})"
                                                   if a.target else ""),
             f"- per trial, median: wall {_num(_median(r['wall_seconds'] for r in done))} s, training "
             f"{_num(_median(r['train_seconds'] for r in done))} s, the digest's wait "
             f"{_num(_median(r.get('digest_seconds') for r in done), '.3f')} s; first trial of a shape up to "
             f"{_num(max((r['wall_seconds'] for r in done), default=None))} s",
             f"- XLA compilations: {sum(r.get('compiles') or 0 for r in done)}, compile-cache loads: "
             f"{sum(r.get('compile_cache_hits') or 0 for r in done)}",
             f"- device: {env.get('device', '?')}; recorded settings: deterministic {env.get('deterministic')}, "
             f"tf32 {env.get('tf32')}; {env.get('backend', '?')} {env.get('jax', '')}, Keras {env.get('keras', '?')}",
             ""]
    return lines


def _read_csv(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _f(v) -> float | None:
    try:
        return float(v) if v not in (None, "") else None
    except ValueError:
        return None


def profile(a) -> list[str]:
    rows = _read_csv(a.csv)
    torch = {}
    setting = {}
    if a.torch and Path(a.torch).is_file():
        doc = json.loads(Path(a.torch).read_text())
        setting = doc["setting"]
        torch = {int(r["batch_size"]): r for r in doc["rows"]}
    lines = [f"## {a.label}", ""]
    if setting:
        lines += [f"PyTorch {setting['torch']} on {setting['device']}, in the same call: TF32 "
                  f"{'allowed' if setting['tf32'] else 'forbidden'} for matmuls and convolutions"
                  f"{', bfloat16 autocast' if setting.get('bf16') else ''}.", ""]
    lines += ["| batch size | catsdogs images/s | MFU % | NVML util % | peak MiB | status | PyTorch images/s | "
              "catsdogs / PyTorch |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = int(r["batch_size"])
        ours, ref = _f(r.get("images_per_second")), torch.get(b)
        theirs = ref.get("images_per_second") if ref else None
        ratio = ours / theirs if ours and theirs else None
        lines.append(f"| {b} | {_num(ours, '.0f')} | {_num(_f(r.get('mfu_percent')))} | "
                     f"{_num(_f(r.get('nvml_gpu_util_mean_percent')), '.0f')} | {_num(_f(r.get('peak_memory_mb')), '.0f')} "
                     f"| {r['status']} | {_num(theirs, '.0f')} | {_num(ratio)} |")
    best = max((r for r in rows if _f(r.get("images_per_second"))), key=lambda r: _f(r["images_per_second"]), default=None)
    ref_best = max((r for r in torch.values() if r.get("images_per_second")), key=lambda r: r["images_per_second"],
                   default=None)
    lines.append("")
    if best:
        text = f"Best: catsdogs {_f(best['images_per_second']):.0f} images/s at batch size {best['batch_size']}"
        if ref_best:
            ratio = _f(best["images_per_second"]) / ref_best["images_per_second"]
            text += (f"; PyTorch {ref_best['images_per_second']:.0f} at {ref_best['batch_size']}: {ratio:.2f}× "
                     f"(target ≥ 1: {'met' if ratio >= 1 else 'NOT met'})")
        lines.append(text + ".")
    return [*lines, ""]


def find(a) -> list[str]:
    s = json.loads(Path(a.json).read_text())
    pred = s.get("prediction") or {}
    noise = s.get("noise_scale") or {}
    rec = s.get("recommendation") or {}
    t = s.get("seconds") or {}
    bound = s.get("search_bound") or {}
    stopped = s.get("stopped_by") or ("max" if s.get("reached_max") else "memory")
    if stopped in ("data", "max"):
        what = f"the {bound.get('train_images')} training images" if stopped == "data" else f"--max {bound.get('batch_size')}"
        fit = f"{s.get('largest_fitting')}: every size up to {what} fit, memory did not bind"
        apart = "no measured limit to compare with"
    else:
        fit = f"{s.get('largest_fitting')} (the next, {s.get('first_not_fitting')}, did not)"
        apart = f"{_num(pred.get('percent_apart'), '+.1f')}% from the measured (target within 15%)"
    total = t.get("total")
    met = "" if total is None or not a.target else f" (target ≤ {a.target:.0f} s: {'met' if total <= a.target else 'NOT met'})"
    probes = s.get("probes") or []
    lines = [f"## {a.label}", "",
             f"- the answer: {_num(total, '.0f')} s{met}: the noise scale {_num(t.get('noise_scale'), '.0f')} s, "
             f"the memory model {_num(t.get('prediction'), '.0f')} s, {len(probes)} probes {_num(t.get('probes'), '.0f')} s",
             "- probes (batch: status, worker, wall s): " + ", ".join(
                 f"{p['batch_size']}: {p['status']}, {p.get('worker')}, {_num(p.get('wall_seconds'), '.1f')}" for p in probes),
             f"- largest batch size that fits: {fit}; XLA's share of the GPU: {s.get('memory_fraction') or '—'}",
             f"- predicted before the search: {pred.get('max_batch_size')} ({pred.get('method')}, compiled at "
             f"{', '.join(map(str, pred.get('planned_bytes') or {})) or '—'}): {apart}"
             + (f"; carried on by the probes to {pred['refined']['max_batch_size']}" if pred.get("refined") else "")
             + (f"; held to the worker's pool's largest region ({pred['pool']['largest_region_bytes'] / 2**20:.0f} MiB),"
                f" the plan alone {pred['pool']['plan_max_batch_size']}"
                if pred.get("pool") and pred["pool"]["max_batch_size"] < pred["pool"]["plan_max_batch_size"] else ""),
             f"- the search ended by the allocator's words: no size above {s['pool_ceiling']['batch_size']} fits in "
             f"the worker's pool (from the probe of {s['pool_ceiling']['from']})" if s.get("pool_ceiling")
             else "- the search ended by probes alone",
             "- out of memory, why (batch: MiB asked, largest free block, in use, the pool; the cause): " + (", ".join(
                 f"{p['batch_size']}: {_num(p.get('oom_asked_mb'), '.0f')}, {_num(p.get('oom_largest_free_mb'), '.0f')}, "
                 f"{_num(p.get('oom_in_use_mb'), '.0f')}, {_num(p.get('oom_pool_mb'), '.0f')}; "
                 f"{p.get('oom_cause') or 'not said'}"
                 for p in probes if p["status"] == "oom") or "none"),
             f"- noise scale: {describe(NoiseEstimate.from_dict(noise))}"
             + (f", measured in {noise['seconds']:.0f} s" if noise.get("seconds") is not None else ""),
             f"- recommendation: {rec.get('batch_size')} at {_num(rec.get('images_per_second'), '.0f')} images/s, "
             f"{rec.get('binding')} binds; learning rate {_num(rec.get('learning_rate'), '.3g')} "
             f"({rec.get('learning_rate_rule')} rule)",
             ""]
    return lines


def race(a) -> list[str]:
    """The race's answer as find-batch-size prints it, its time against the target (at most 90 s), and
    each raced size's time to the target in the critical plan run beside it, where it ran (median
    steps over its seeds at its best rate, times the race's steady step time)."""
    from catsdogs.measure.find_summary import race_lines

    answer = json.loads(Path(a.json).read_text())
    r = answer["race"]
    table = {str(t["batch_size"]): t["step_seconds"] for t in (answer.get("recommendation") or {}).get("table") or []}
    lines = [f"## {a.label}", "", *race_lines(r),
             f"- the race took {r['seconds']:.0f} s (target ≤ 90 s: {'met' if r['seconds'] <= 90 else 'NOT met'})"]
    truth = _critical_times(Path(a.out), {**table, **(r["steady_step_seconds"] or {})})  # (the probe's where not raced)
    d = r.get("decision")
    if truth and d and d["batch_size"] in truth:
        best = min(truth, key=truth.get)
        lines.append(f"- against the critical plan: T({d['batch_size']}) / T(best, {best}) = "
                     f"{truth[d['batch_size']] / truth[best]:.2f} (target ≤ 1.25); by size: "
                     + ", ".join(f"{b}: {t:.2f} s" for b, t in sorted(truth.items())))
    elif d:
        lines.append(f"- the critical plan gave no time for {d['batch_size']}: {sorted(truth) or 'no store'}")
    parts = _fixed_parts(Path(a.out), r.get("sweep"))
    if parts:
        lines.append("- a trial's seconds besides its training, medians by size (the validation curve's evaluations, "
                     "the step's build, the rest: tests, diagnosis, data, hand-over): " + ", ".join(
                         f"{b}: {e:.2f} + {s:.2f} + {o:.2f}" for b, (e, s, o) in sorted(parts.items())))
    return [*lines, ""]


def _fixed_parts(out: Path, sweep: str | None) -> dict[int, tuple[float, float, float]]:
    """The race's trials' time outside training, split: eval_seconds, setup_seconds and the rest of
    wall_seconds less train_seconds, medians by batch size (where on the GPU a race's time goes)."""
    from statistics import median

    from catsdogs.store import Store, store_path

    if not sweep or not store_path(out).exists():
        return {}
    with Store(store_path(out), read_only=True) as store:
        rows = store.trials(sweep) if sweep in store.sweeps() else []
    split: dict[int, list[tuple[float, float, float]]] = {}
    for row in rows:
        wall, train = row.get("wall_seconds"), row.get("train_seconds")
        if wall is None or train is None:
            continue
        e, s = row.get("eval_seconds") or 0.0, row.get("setup_seconds") or 0.0
        split.setdefault(row["config"]["batch_size"], []).append((e, s, max(0.0, wall - train - e - s)))
    return {b: tuple(median(x[i] for x in v) for i in range(3)) for b, v in split.items()}


def _critical_times(out: Path, steady: dict) -> dict[int, float]:
    from catsdogs.analysis.to_target import best_rate_steps
    from catsdogs.store import Store, store_path

    if not store_path(out).exists():
        return {}
    with Store(store_path(out), read_only=True) as store:
        if "critical" not in store.sweeps():
            return {}
        trials = [t for t in store.trials("critical") if t["config"]["optimizer"] == "sgd"]
    return {b: s * steady[str(b)] for b, s in best_rate_steps(trials).items() if str(b) in steady and s != float("inf")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("reproduce")
    r.add_argument("--out", required=True)
    r.add_argument("--name", required=True)
    r.add_argument("--seconds", type=float, required=True)
    r.add_argument("--target", type=float, default=None)
    p = sub.add_parser("profile")
    p.add_argument("--csv", required=True)
    p.add_argument("--torch", default=None)
    f = sub.add_parser("find")
    f.add_argument("--json", required=True)
    f.add_argument("--target", type=float, default=None)
    race_ = sub.add_parser("race")
    race_.add_argument("--json", required=True)
    race_.add_argument("--out", required=True)
    for s in (r, p, f, race_):
        s.add_argument("--label", required=True)
    a = ap.parse_args()
    print("\n".join({"reproduce": reproduce, "profile": profile, "find": find, "race": race}[a.what](a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
