"""The article's claims, each tested as a comparison between cells of a sweep, with a verdict.

A claim (docs/protocol.md, "The two figures") names a **cell** (optimizer, data set, batch
size, under the article's protocol) and what it says of it against other cells:

- `above t`: mean(cell) - mean(other) > t points (t = 0: higher; t = -5: "still good", no more
  than 5 points worse);
- `below t`: mean(cell) - mean(other) < t points (t = -5: a sharp drop, more than 5 points);
- `best`: the cell is above every other cell of its optimizer's batch sizes.

The difference of two cells' mean test accuracies gets Welch's 95% interval (catsdogs.stats
says why Welch), each cell's per-seed sd never below the binomial sd of its test set (two cells
whose seeds all agree, at 50% for instance, are not settled by that alone). The verdict:

- **supported**: the whole interval is on the claimed side of t;
- **contradicted**: the whole interval is on the other side;
- **unsettled with n seeds**: the interval straddles t (or a cell has fewer than 2 seeds);
- **not run**: a cell the claim needs has no finished trial in the sweep.

For `best`, supported means above every rival (each interval above 0: an intersection-union
test, valid without correction), contradicted means some rival is clearly better.

Pure functions of a sweep's trial rows (as `rows.load_trials` returns them): no framework.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from catsdogs.analysis.rows import field, is_article_protocol, per_context
from catsdogs.optimizers import label
from catsdogs.schema import Status
from catsdogs.stats import LEVEL, welch

Cell = tuple[str, str, int]  # (optimizer, dataset, batch size), article protocol

SUPPORTED, CONTRADICTED, UNSETTLED, NOT_RUN = "supported", "contradicted", "unsettled", "not run"
SHARP = 5.0  # points: what a "sharp" drop or "still good" allows; a few standard errors of one run


@dataclass(frozen=True)
class Claim:
    id: str
    says: str  # the article's statement, in our words
    test: str  # what is compared
    cell: Cell
    versus: tuple[Cell, ...]
    kind: str  # "above", "below" or "best"
    threshold: float = 0.0  # points


def _sgd(bs: int) -> Cell:
    return ("sgd", "standard", bs)


def _adam(bs: int, dataset: str = "standard") -> Cell:
    return ("adam", dataset, bs)


CLAIMS = (
    Claim("sgd-falls", "SGD does best at batch size 16 and falls fast as the batch grows",
          "SGD at 32 is below SGD at 16", _sgd(32), (_sgd(16),), "below"),
    Claim("sgd-best-16", "16 is the optimal batch size for SGD",
          "SGD at 16 is above SGD at every other batch size", _sgd(16), (_sgd(32), _sgd(64), _sgd(128)), "best"),
    Claim("adam-good-64", "Adam is still good (about 67%) at batch size 64",
          f"Adam at 64 is less than {SHARP:g} points below Adam at 16, or above it", _adam(64), (_adam(16),),
          "above", -SHARP),
    Claim("adam-best-64", "64 is the optimal batch size for Adam",
          "Adam at 64 is above Adam at every other batch size", _adam(64), (_adam(16), _adam(32), _adam(128)),
          "best"),
    Claim("sgd-drop-128", "SGD falls sharply from batch size 128",
          f"SGD at 128 is more than {SHARP:g} points below SGD at 64", _sgd(128), (_sgd(64),), "below", -SHARP),
    Claim("adam-drop-128", "Adam falls sharply from batch size 128",
          f"Adam at 128 is more than {SHARP:g} points below Adam at 64", _adam(128), (_adam(64),), "below", -SHARP),
    Claim("augmented-128", "Augmented data softens the drop at batch size 128 (58%)",
          "Adam, augmented at 128 is above Adam, standard at 128", _adam(128, "augmented"), (_adam(128),), "above"),
    Claim("augmented-256", "Augmented data softens the drop at batch size 256 (57.5%)",
          "Adam, augmented at 256 is above Adam, standard at 256", _adam(256, "augmented"), (_adam(256),), "above"),
)


def cell_name(cell: Cell) -> str:
    opt, dataset, bs = cell
    name = label(opt)
    return f"{name}{', augmented' if dataset == 'augmented' else ''} at {bs}"


def _verdict(kind: str, low: float | None, high: float | None, threshold: float) -> str | None:
    """SUPPORTED / CONTRADICTED / None (unsettled) for one comparison's interval, in points."""
    if low is None:
        return None
    if kind == "above":
        return SUPPORTED if low > threshold else CONTRADICTED if high < threshold else None
    return SUPPORTED if high < threshold else CONTRADICTED if low > threshold else None


def evaluate(claim: Claim, accuracies: dict[Cell, list[float]], n_test: int | None = None) -> dict:
    """One claim against the cells' accuracies (fractions, one per finished seed), measured on
    `n_test` test images each (the floor of Welch's interval: catsdogs.stats.welch).

    Returns {"claim", "verdict", "verdict_text", "diff", "ci_low", "ci_high" (points, the
    comparison shown: for `best` the one with the strongest rival), "versus" (that rival), "n"
    (seeds of the cell and of each rival), "missing" (cells without a finished trial)}."""
    cells = (claim.cell, *claim.versus)
    missing = [c for c in cells if not accuracies.get(c)]
    n = {c: len(accuracies.get(c) or []) for c in cells}
    out = {"claim": claim, "missing": missing, "n": n, "diff": None, "ci_low": None, "ci_high": None,
           "versus": claim.versus[0]}
    if missing:
        return {**out, "verdict": NOT_RUN, "verdict_text": f"not run: no finished trial of "
                f"{', '.join(cell_name(c) for c in missing)}"}
    comparisons = {}
    for other in claim.versus:
        w = welch(accuracies[claim.cell], accuracies[other], n_test=n_test)
        comparisons[other] = {k: None if w[k] is None else 100 * w[k] for k in ("diff", "ci_low", "ci_high")}
    if claim.kind == "best":
        shown = max(claim.versus, key=lambda c: sum(accuracies[c]) / len(accuracies[c]))  # the strongest rival
        each = [_verdict("above", v["ci_low"], v["ci_high"], 0.0) for v in comparisons.values()]
        verdict = (CONTRADICTED if CONTRADICTED in each else
                   SUPPORTED if all(v == SUPPORTED for v in each) else None)
    else:
        shown = claim.versus[0]
        v = comparisons[shown]
        verdict = _verdict(claim.kind, v["ci_low"], v["ci_high"], claim.threshold)
    out.update(comparisons[shown], versus=shown)
    if verdict is None:
        counts = sorted(set(n.values()))
        seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        plural = "" if counts == [1] else "s"
        return {**out, "verdict": UNSETTLED, "verdict_text": f"unsettled with {seeds} seed{plural}"}
    return {**out, "verdict": verdict, "verdict_text": verdict}


def article_cells(trials: Iterable[dict]) -> dict[Cell, list[float]]:
    """Finished accuracies of the article-protocol trials by cell (trials of one context)."""
    out: dict[Cell, list[float]] = {}
    for t in trials:
        if t.get("status") != Status.DONE or t.get("test_accuracy") is None or not is_article_protocol(t):
            continue
        cell = (field(t, "optimizer"), field(t, "dataset"), int(field(t, "batch_size")))
        out.setdefault(cell, []).append(float(t["test_accuracy"]))
    return out


def evaluate_all(accuracies: dict[Cell, list[float]], n_test: int | None = None) -> list[dict]:
    return [evaluate(c, accuracies, n_test) for c in CLAIMS]


def claims_by_context(trials: list[dict], n_test: int | None = None) -> list[dict]:
    """The article's claims on the sweep's article-protocol cells, in each context (rows.context_of)
    that has some: [{"context", "results"}]; [] when none has. `n_test`: the test images."""
    return per_context(trials, lambda context, members: evaluate_all(cells, n_test)
                       if (cells := article_cells(members)) else [])


def sentence(result: dict) -> str:
    """One plain sentence: the claim, what the seeds say, and the verdict."""
    claim = result["claim"]
    if result["verdict"] == NOT_RUN:
        return f"*{claim.says}*: {result['verdict_text']}."
    d, low, high = result["diff"], result["ci_low"], result["ci_high"]
    rival = cell_name(result["versus"])
    what = f"{cell_name(claim.cell)} is {abs(d):.1f} points {'above' if d >= 0 else 'below'} {rival}"
    if claim.kind == "best":
        what += ", its strongest rival"
    interval = (f" (95% interval {low:+.1f} to {high:+.1f})" if low is not None
                else " (no interval: a cell has one seed)")
    return f"*{claim.says}*: {what}{interval}: **{result['verdict_text']}**."


def markdown_table(results: list[dict]) -> list[str]:
    head = ["claim (the article)", "test", "difference (points)", f"{LEVEL:.0%} interval", "seeds", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    for r in results:
        claim = r["claim"]
        diff = "—" if r["diff"] is None else f"{r['diff']:+.1f}"
        if claim.kind == "best" and r["diff"] is not None:
            diff += f" vs {r['versus'][2]}"
        interval = "—" if r["ci_low"] is None else f"{r['ci_low']:+.1f} to {r['ci_high']:+.1f}"
        seeds = " / ".join(str(r["n"][c]) for c in (claim.cell, *claim.versus))
        verdict = r["verdict_text"] if r["verdict"] == NOT_RUN else f"**{r['verdict_text']}**"
        lines.append("| " + " | ".join([claim.says, claim.test, diff, interval, seeds, verdict]) + " |")
    return lines
