"""Which learning rate find-batch-size's anchor chooses, seed by seed, by the least loss and by the
largest rate within a tie of it (noise_run.ANCHOR_TIE), replayed from a store of the anchor's own
runs: 2 epochs at the base batch size, at the three rates of the anchor's grid, on many seeds.

    catsdogs sweep --data-dir D --out O --name adam --opt adam --batch-size 32 --lr 0.001 0.003 0.01 \\
        --seeds 12 --epochs 2
    python studies/anchor_rates.py --out O --sweep adam --best 0.01
    KERAS_BACKEND=jax catsdogs sweep ... --name both --opt adam sgd --lr 0.001 0.003 0.01 0.03 0.1 ...
    python studies/anchor_rates.py --out O --sweep both --opt sgd --rates 0.01 0.03 0.1 --best 0.1

For each first seed s it replays what find-batch-size does with `--seed s` (seed s's runs at the
three rates, seed s+1's where none of s's took off: noise_run.anchor_rounds and rate_test) under
each tie, and prints the choices, how many are `--best` (the rate the `critical` plan's 20-seed
cells put nearest the fastest to the target at that batch size), and how much one seed's paired
comparison of two rates varies from seed to seed: the standard deviation over seeds of the log of
their final losses' ratio, which is what a tie must cover.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from catsdogs.analysis.rows import load_trials
from catsdogs.measure import noise_run
from catsdogs.messages import TrialRecord
from catsdogs.store import store_path


def runs_by_seed(trials: list[dict], optimizer: str | None = None,
                 rates: list[float] | None = None) -> tuple[list[float], dict[tuple[int, float], TrialRecord]]:
    """The grid's rates and each (seed, rate)'s record, as the anchor's runs return them (of
    `optimizer` and at `rates` only, where given: a sweep over more)."""
    runs = {(int(t["config"]["seed"]), float(t["learning_rate"])):
            TrialRecord(status=t["status"], history=t.get("history") or [], collapsed=t.get("collapsed") or 0)
            for t in trials if t.get("learning_rate") is not None
            and optimizer in (None, t["config"]["optimizer"])
            and (rates is None or any(math.isclose(t["learning_rate"], r) for r in rates))}
    return sorted({lr for _, lr in runs}), runs


def choose(rates: list[float], runs: dict, seed: int, tie: float) -> dict:
    """find-batch-size's choice from first seed `seed` with ANCHOR_TIE set to `tie`."""
    learned = noise_run.ANCHOR_LEARNED * math.log(2)
    seeds = [s for s in range(seed, seed + noise_run.ANCHOR_SEEDS) if all((s, r) in runs for r in rates)]
    rounds = noise_run.anchor_rounds(lambda s, r: runs[s, r], rates, seeds, learned)
    return noise_run.rate_test(rates, rounds, learned, tie=tie)


def paired_spread(rates: list[float], runs: dict) -> list[tuple[float, float, float, int]]:
    """For each pair of neighbouring rates, the mean and the standard deviation over seeds of the log
    of their final losses' ratio (seeds where both trained and neither collapsed), and the seeds."""
    out = []
    for a, b in zip(rates, rates[1:], strict=False):
        logs = []
        for (s, r), rec in runs.items():
            other = runs.get((s, b))
            if r != a or other is None:
                continue
            la, lb = noise_run.final_loss(rec), noise_run.final_loss(other)
            if la and lb and not rec.collapsed and not other.collapsed:
                logs.append(math.log(lb / la))
        if len(logs) >= 2:
            out.append((a, b, statistics.mean(logs), statistics.stdev(logs), len(logs)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="the store's folder (the sweep's --out)")
    parser.add_argument("--sweep", required=True, help="the sweep of the anchor's runs")
    parser.add_argument("--best", type=float, help="the grid's rate nearest the fastest to the target")
    parser.add_argument("--opt", default=None, help="this optimizer's trials only (a sweep over both)")
    parser.add_argument("--rates", type=float, nargs="+", default=None, help="these rates only (a sweep over more)")
    parser.add_argument("--ties", type=float, nargs="+", default=[1.0, noise_run.ANCHOR_TIE],
                        help="ties to compare (1.0: the least loss alone)")
    args = parser.parse_args()
    rates, runs = runs_by_seed(load_trials(store_path(args.out), args.sweep), args.opt, args.rates)
    seeds = sorted({s for s, _ in runs})
    print(f"rates {', '.join(f'{r:g}' for r in rates)}; final losses after 2 epochs (c: collapsed, -: not run)")
    print("seed  " + "  ".join(f"{r:>7g}" for r in rates) + "  " + "  ".join(f"tie {t:g}" for t in args.ties))
    counts = {t: 0 for t in args.ties}
    for s in seeds:
        cells = []
        for r in rates:
            rec = runs.get((s, r))
            loss = noise_run.final_loss(rec) if rec else None
            cells.append("c" if rec and rec.collapsed else "-" if loss is None else f"{loss:.3f}")
        chosen = []
        for t in args.ties:
            c = choose(rates, runs, s, t)["chosen"]
            counts[t] += args.best is not None and c is not None and math.isclose(c, args.best)
            chosen.append("none" if c is None else f"{c:g}")
        print(f"{s:>4}  " + "  ".join(f"{c:>7}" for c in cells) + "  " + "  ".join(f"{c:>7}" for c in chosen))
    if args.best is not None:
        print("chose " + ", ".join(f"{args.best:g} in {counts[t]} of {len(seeds)} with tie {t:g}" for t in args.ties))
    for a, b, mean, sd, n in paired_spread(rates, runs):
        print(f"log(loss at {b:g} / loss at {a:g}) over {n} seeds: mean {mean:+.3f}, sd {sd:.3f} (a factor {math.exp(sd):.2f})")


if __name__ == "__main__":
    main()
