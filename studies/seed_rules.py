"""How many seeds each cell of an adaptive sweep gets under catsdogs 0.7.1's rule (the binomial
floor on the per-seed sd) against 0.7.0's (none), and which claims' verdicts that changes.

Both rules are replayed from one store, the one a sweep under the new rule wrote. That is exact:
a trial is deterministic for its seed, and the floor only ever widens an interval, so under the
old rule every cell stops at a seed count the new rule also reached, and the store holds every
trial the old rule would have run.

    python studies/seed_rules.py --out-dir outputs --sweep article-64px

Prints, per cell, its seeds and 95% half-width under each rule (and whether the floor decided
the new one), the total trials, then the claims' verdicts under each rule.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from catsdogs import config
from catsdogs.analysis import claims
from catsdogs.analysis.rows import load_trials, sweep_config
from catsdogs.manifest import test_images
from catsdogs.schema import Status, TrialConfig
from catsdogs.seeds import interval
from catsdogs.store import store_path


def replay(members: list[dict], start: int, target: float, most: int, n_test: int | None) -> dict:
    """Where one cell stops under a rule (n_test None: no floor), its seeds taken in order from the
    store as the sweep's rounds would have added them."""
    by_seed = {int(m["config"]["seed"]): m for m in members}
    n = start
    while True:
        rows = [by_seed.get(s) for s in range(n)]
        if any(r is None for r in rows):
            return {"seeds": n, "half_width": None, "floored": False, "state": "not in the store"}
        accs = [r["test_accuracy"] for r in rows if r["status"] == Status.DONE and r.get("test_accuracy") is not None]
        ci = interval(accs, n_test)
        if ci["half_width"] is not None and ci["half_width"] <= target:
            return {"seeds": n, **ci, "state": "met"}
        if rows[-1]["status"] in (Status.FAILED, Status.OOM):
            return {"seeds": n, **ci, "state": f"stopped ({rows[-1]['status']})"}
        if n >= most:
            return {"seeds": n, **ci, "state": "max-seeds"}
        n += 1


def label(cell: TrialConfig) -> str:
    return " ".join(cell.label().split()[:3])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=Path(config.DEFAULT_OUT), help="where results.sqlite is")
    p.add_argument("--sweep", default="article-64px")
    a = p.parse_args()
    trials = load_trials(store_path(a.out_dir), a.sweep)
    recorded = sweep_config(store_path(a.out_dir), a.sweep)
    adaptive = recorded.get("adaptive")
    if not adaptive:
        raise SystemExit(f"sweep {a.sweep!r} did not use adaptive seeds")
    n_test = test_images(recorded["data"]["counts"])
    start = (recorded.get("plan") or {}).get("seeds", config.SEEDS)
    target, most = adaptive["target_ci"], adaptive["max_seeds"]
    cells: dict[TrialConfig, list[dict]] = {}
    for t in trials:
        cells.setdefault(TrialConfig.from_dict(t["config"]).cell(), []).append(t)

    print(f"Sweep {a.sweep}: target ±{target:g} points, {start} to {most} seeds, {n_test} test images")
    print("| cell | seeds, 0.7.0 (no floor) | half-width | seeds, 0.7.1 (floor) | half-width | the floor decided |")
    print("|---|---|---|---|---|---|")
    kept = {"old": set(), "new": set()}
    totals = {"old": 0, "new": 0}
    for cell, members in cells.items():
        old = replay(members, start, target, most, None)
        new = replay(members, start, target, most, n_test)
        for rule, r in (("old", old), ("new", new)):
            totals[rule] += r["seeds"]
            kept[rule] |= {m["key"] for m in members if int(m["config"]["seed"]) < r["seeds"]}

        def hw(r):
            return "—" if r["half_width"] is None else f"±{r['half_width']:.1f}"
        print(f"| {label(cell)} | {old['seeds']} ({old['state']}) | {hw(old)} | {new['seeds']} ({new['state']}) "
              f"| {hw(new)} | {'yes' if new['floored'] else ''} |")
    print(f"Trials: {totals['old']} under 0.7.0's rule, {totals['new']} under 0.7.1's.")

    verdicts = {}
    for rule in ("old", "new"):
        for context in claims.claims_by_context([t for t in trials if t["key"] in kept[rule]]):
            for r in context["results"]:
                verdicts.setdefault((context["context"], r["claim"].says), {})[rule] = r
    print()
    print("| claim | 0.7.0's seeds: verdict | difference (95% interval) | 0.7.1's seeds: verdict | difference (95% interval) | changed |")
    print("|---|---|---|---|---|---|")
    for (_, says), by_rule in verdicts.items():
        def show(r):
            if r is None:
                return "—", "—"
            iv = "" if r["ci_low"] is None else f" ({r['ci_low']:+.1f} to {r['ci_high']:+.1f})"
            diff = "—" if r["diff"] is None else f"{r['diff']:+.1f}{iv}"
            return r["verdict_text"], diff
        (ov, od), (nv, nd) = show(by_rule.get("old")), show(by_rule.get("new"))
        changed = "**yes**" if (by_rule.get("old") or {}).get("verdict") != (by_rule.get("new") or {}).get("verdict") else ""
        print(f"| {says} | {ov} | {od} | {nv} | {nd} | {changed} |")


if __name__ == "__main__":
    main()
