"""The report's tables as text: results.md (every figure's cells, the claims, collapses, tuning,
adaptive seeds) and summary.csv (every figure's cells, one row each)."""

from __future__ import annotations

import csv
import io

from catsdogs.analysis import claims, critical, time_to_target, to_target
from catsdogs.analysis.rows import field, protocol_label, protocol_of
from catsdogs.analysis.tables import CELL_CSV_COLUMNS, incomplete_note
from catsdogs.schema import UNFINISHED
from catsdogs.stats import LEVEL

CSV_COLUMNS = ["figure", *CELL_CSV_COLUMNS]  # summary.csv


def _pct(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{100 * v:.{digits}f}"


def markdown(name: str, summary: dict, note: str | None = None) -> str:
    """results.md: one section per figure, one row per cell."""
    lines = [f"# Sweep `{name}`: results", ""]
    if note:
        lines += [f"*{note}*", ""]
    lines += [
        f"Test accuracy in %, over the seeds of each cell: the mean, its {LEVEL:.0%} confidence "
        "interval (Student t: mean ± t·sd/√n, t the 0.975 quantile with n − 1 degrees of freedom) "
        "and the sample standard deviation (sd, in points). A cell with one finished seed has no "
        "interval (marked n=1). *article*: the value the article reports (its text, one run). "
        "failed / oom / pending / interrupted / running: trials of the cell that did not finish, or not "
        "yet (interrupted: running when its sweep process was killed; the next sweep runs it again); "
        "none is dropped.", ""]
    lines += claims_markdown(summary.get("claims") or [], summary.get("critical") or [])
    if not summary["figures"]:
        lines += ["No figure: the sweep has no trial that any figure shows.", ""]
    for table in summary["figures"]:
        lines += [f"## {table['name']}", "", table["title"] + (f" · {table['setting']}" if table["setting"] else ""), "",
                  f"![{table['name']}](figures/{table['name']}.png)", ""]
        left = incomplete_note(table["rows"])
        if left:
            lines += [f"**{left}.**", ""]
        x_name = "effective batch" if table["name"] == "accumulation" else "batch size"
        head = ["series", x_name, "n done", "mean", "95% CI low", "95% CI high", "sd",
                *(str(k) for k in UNFINISHED), "article"]
        if table["name"] == "accumulation":
            head.insert(2, "batch × steps")
        lines += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
        for r in table["rows"]:
            if r["n_done"] == 1:
                low = high = "— (n=1)"
            else:
                low, high = _pct(r["ci_low"]), _pct(r["ci_high"])
            cols = [r["series"], str(r["x"]), str(r["n_done"]), _pct(r["mean"]), low, high,
                    _pct(r["sd"], 2), *(str(r[f"n_{k}"]) for k in UNFINISHED), _pct(r["article"])]
            if table["name"] == "accumulation":
                cols.insert(2, f"{r['batch_size']} × {r['accumulate']}")
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cols) + " |")
        if table["name"] == "tuned":
            lines += tuned_markdown(table)
        errors = sorted({e.strip().splitlines()[-1][:160] for r in table["rows"] for e in r["errors"] if e.strip()})
        if errors:
            lines += ["", "Errors of the failed / out-of-memory trials:", ""]
            lines += [f"- `{e}`" for e in errors]
        lines.append("")
    lines += collapse_markdown(summary.get("collapse"))
    lines += adaptive_markdown(summary.get("adaptive"))
    lines += noise_markdown(name, summary.get("noise"), summary.get("critical") or [])
    lines += to_target.markdown(summary.get("to_target") or [])
    lines += time_to_target.markdown(summary.get("time_to_target"))
    unused = summary["unused"]
    if unused:
        kinds: dict[str, int] = {}
        for t in unused:
            what = (f"{field(t, 'optimizer')}, {field(t, 'dataset')} data, "
                    f"{protocol_label(protocol_of(t))}, status {t['status']}")
            kinds[what] = kinds.get(what, 0) + 1
        lines += ["## Not in any figure", "",
                  f"{len(unused)} trials of this sweep belong to none of the figures above:", ""]
        lines += [f"- {n} × {what}" for what, n in sorted(kinds.items())]
        lines.append("")
    return "\n".join(lines)


def claims_markdown(contexts: list[dict], critical_contexts: list[dict] = ()) -> list[str]:
    """The article's claims, and the critical batch size's (catsdogs.analysis.critical) in the
    same table, per context."""
    if not contexts and not critical_contexts:
        return []
    extra = {c["context"]: c["results"] for c in critical_contexts}
    contexts = [*contexts, *({"context": c, "results": []} for c in extra if c not in {x["context"] for x in contexts})]
    lines = ["## The article's claims", "",
             "Each claim of the article compares cells of its protocol. The difference of two cells' mean "
             f"test accuracies (points) has Welch's {LEVEL:.0%} interval (unequal spreads and numbers of "
             "seeds; see catsdogs/stats.py). **supported**: the interval lies wholly on the claimed side; "
             "**contradicted**: wholly on the other; **unsettled**: it straddles the line, so more seeds "
             f"are needed. A \"sharp\" drop is more than {claims.SHARP:g} points; \"still good\" is less than "
             f"{claims.SHARP:g} points below; \"optimal\" is above every other batch size of the optimizer "
             "(shown: against its strongest rival). Seeds: the cell's, then the compared cells'.", ""]
    if extra:
        lines += ["The last rows test the paper's model of the critical batch size (McCandlish et al. 2018) "
                  "against this sweep, per series: section *Noise scale* below says how.", ""]
    for ctx in contexts:
        if len(contexts) > 1:
            lines += [f"### {ctx['context']}", ""]
        lines += claims.markdown_table(ctx["results"]) + critical.table_rows(extra.get(ctx["context"], [])) + [""]
        lines += [f"- {claims.sentence(r)}" for r in ctx["results"]] + [""]
    return lines


def noise_markdown(name: str, table: dict | None, contexts: list[dict]) -> list[str]:
    """The noise scale over training, the cells that lack it, and the critical-batch-size claim
    in detail."""
    if not table or not table["measured"]:
        return []
    lines = ["## Noise scale", "",
             "B_simple = tr(Σ)/|G|² (McCandlish et al. 2018): the batch size at which the gradient's noise "
             "equals its signal, below which doubling the batch nearly halves the steps and above which it buys "
             "little. Each trial recorded with `--noise-scale` measured it before its first update (epoch 0) "
             f"and after every epoch ({', '.join(f'{p} pairs of {s} and {b} images' for s, b, p in table['sampling'])}, "
             "drawn with replacement, apart from training). Per cell and epoch, the pairs of all its seeds "
             "pooled: the ratio of means over every pair, with Fieller's 95% interval (∞: unbounded above); "
             "\"≥ N\": the noise dominated, a lower bound only. Training draws each epoch's batches *without* "
             "replacement from its n images, which shrinks a batch's gradient noise by (n − B)/(n − 1) (0.79 at "
             "B = 256 of n = 1,200): these are the with-replacement values, and as B nears n the noise training "
             "sees is smaller than they say. catsdogs/gradient_noise.py says how it is estimated.",
             ""]
    if table["groups"]:
        lines += ["![noise](figures/noise.png)", ""]
    for g in table["groups"]:
        epochs = sorted({p.epoch for s in g["series"] for p in s["points"]})
        lines += [f"**{g['label']}**", "", "| series | seeds | " + " | ".join(f"epoch {e}" for e in epochs) + " |",
                  "|---|---|" + "---|" * len(epochs)]
        for s in g["series"]:
            by_epoch = {p.epoch: p for p in s["points"]}
            cols = [critical.point_text(by_epoch[e]) if e in by_epoch else "—" for e in epochs]
            lines.append(f"| {s['label']} | {s['seeds']} | " + " | ".join(cols) + " |")
        lines.append("")
    if table["missing"]:
        lines += [f"{len(table['missing'])} cells have finished trials without the measurement (run before it, "
                  "or without `--noise-scale`):", ""]
        lines += [f"- {m['cell']}: seeds {', '.join(map(str, m['seeds']))}" for m in table["missing"]]
        lines += ["", "To measure them, run the sweep again with `--noise-scale --overwrite` (for example "
                  f"`catsdogs sweep --name {name} --config PLAN --noise-scale --overwrite`, with the plan or options "
                  "that made it; `--opt` and `--batch-size` limit it to these cells). `--overwrite` trains every "
                  "trial it names again; with deterministic kernels (the default) to the same weights.", ""]
    for ctx in contexts:
        lines += [f"**The critical batch size, {ctx['context']}.** The paper's model: S = S_min(1 + B_noise/B) steps "
                  "and E = E_min(1 + B/B_noise) examples to reach a target, so a fixed number of epochs reaches it "
                  f"for B ≤ B_noise(E/E_min − 1). Target: within {critical.SHARP:g} points of the smallest batch "
                  "size's final validation accuracy, first reached after epoch e*; E/E_min = (E/e*)(1 + B₀/B_noise); "
                  "B_noise: B_simple at the smallest batch size from epoch e* to the end, every pair of its seeds "
                  "pooled. Well below "
                  "the limit: ≤ half the limit at B_noise's 95% low end; well above: ≥ twice the limit at its high "
                  f"end (none where that is open). Held: less than {critical.SHARP:g} points of test accuracy below the "
                  "smallest batch size (Welch's 95% interval), lost: more. The paper assumes the learning rate tuned "
                  "at every batch size; the article's series keep Keras's default, so the tuned series are the "
                  "fair test.", "",
                  "| series | B₀ | e* | B_noise | E/E_min | limit | well below / above | batch size: predicted, "
                  "difference vs B₀ (95% interval) | verdict |", "|---|---|---|---|---|---|---|---|---|"]
        for r in ctx["results"]:
            bound = "≥ " if r["limit_is_bound"] else ""
            tests = "; ".join(f"{t['batch_size']}: {t['predicted']}, {t['diff']:+.1f}"
                              + ("" if t["ci_low"] is None else f" ({t['ci_low']:+.1f} to {t['ci_high']:+.1f})")
                              + {True: " ✓", False: " ✗", None: " ?"}[t["agrees"]] for t in r["tests"]) or "—"
            sides = "—" if r["held_up_to"] is None else (
                f"≤ {r['held_up_to']:.0f} / " + ("—" if r["lost_from"] is None else f"≥ {r['lost_from']:.0f}"))
            cells = [r["series"], str(r["b0"]), "—" if r["e_star"] is None else str(r["e_star"]),
                     "—" if r["b_noise"] is None else critical.noise_text(r),
                     "—" if r["budget_ratio"] is None else f"{r['budget_ratio']:.2f}",
                     "—" if r["limit"] is None else f"{bound}{r['limit']:.0f}", sides, tests, r["verdict_text"]]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "✓ as predicted, ✗ clearly not, ? unsettled.", ""]
    return lines


def tuned_markdown(table: dict) -> list[str]:
    lines = ["", "Every learning rate tried, per batch size: mean validation accuracy (what chooses) and "
             "mean test accuracy (what the figure reports), over finished seeds; ✓ the choice.", "",
             "| series | batch size | lr | n done | validation | test | chosen |", "|---|---|---|---|---|---|---|"]
    for c in table["choices"]:
        edge = f" ({c['edge']} rate tried: at the edge of the grid, widen it)" if c.get("edge") else ""
        lines.append(f"| {c['series']} | {c['batch_size']} | {c['lr']:g} | {c['n_done']} | {_pct(c['val_mean'])} "
                     f"| {_pct(c['test_mean'])} | {'✓' if c['chosen'] else ''}{edge} |")
    lines.append("")
    on_edge = sum(1 for c in table["choices"] if c.get("edge"))
    if on_edge:
        lines += [f"{on_edge} of the choices sit at the edge of their grid of learning rates: the best rate "
                  "may lie outside it. Widen the grid (the plan's `lr`) until every choice is interior.", ""]
    for d in table["drops"]:
        if d["best"] is None:
            continue
        if d["drop_from"] is None:
            lines.append(f"- {d['series']}: best at batch size {d['best']}; no larger batch size is clearly "
                         "below it (every Welch interval of the difference reaches 0).")
        else:
            w = d["diff"]
            lines.append(f"- {d['series']}: best at batch size {d['best']}; the drop remains from "
                         f"{d['drop_from']}: {100 * w['diff']:+.1f} points (95% interval {100 * w['ci_low']:+.1f} "
                         f"to {100 * w['ci_high']:+.1f}).")
    return lines


def collapse_markdown(table: dict | None) -> list[str]:
    if not table or not table["rows"]:
        return []
    lines = ["## Collapses", "", "A run **collapses** when its trained model predicts one class for every "
             "test image (50% accuracy on the balanced test set). Rate: collapsed runs of those recorded, "
             f"with Wilson's {LEVEL:.0%} interval; accuracy of the runs that did not collapse beside it; "
             "dead units: the mean share of the Dense(128) layer's ReLU units that output 0 for every "
             "test image after training.", "", "![collapse](figures/collapse.png)", "",
             "| series | batch size | runs | collapsed | rate % | 95% CI | accuracy, not collapsed | 95% CI | dead units % |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        ci = f"{_pct(r['collapse_ci_low'], 0)}–{_pct(r['collapse_ci_high'], 0)}"
        ok_ci = ("—" if r["not_collapsed_ci_low"] is None else
                 f"{_pct(r['not_collapsed_ci_low'])}–{_pct(r['not_collapsed_ci_high'])}")
        lines.append(f"| {r['series']} | {r['x']} | {r['n_collapse_known']} | {r['n_collapsed']} | "
                     f"{_pct(r['collapse_rate'], 0)} | {ci} | {_pct(r['not_collapsed_mean'])} | {ok_ci} | "
                     f"{_pct(r['dead_units'], 0)} |")
    return [*lines, ""]


def adaptive_markdown(state: dict | None) -> list[str]:
    if not state:
        return []
    cells_ = state["cells"]
    met = sum(1 for c in cells_.values() if c["state"] == "met")
    floored = sum(1 for c in cells_.values() if c["state"] == "met" and c.get("floored"))
    lines = ["## Adaptive seeds", "", f"Target: every cell's 95% interval within ±{state['target_ci']:g} points, "
             f"with at most {state['max_seeds']} seeds. {met} of {len(cells_)} cells meet it."]
    if floored:  # no cell is settled by agreement alone (catsdogs.seeds)
        lines[-1] += (f" For {floored} of them the test set's sampling noise decided it: their seeds agreed "
                      "more closely than the binomial floor on the per-seed sd allows (marked below).")
    lines += ["", "| cell | seeds | half-width (points) | state | binomial floor |", "|---|---|---|---|---|"]
    why = {"max-seeds": f"reached --max-seeds ({state['max_seeds']})",
           "more": "more seeds needed (the same command adds them)"}
    for cell, c in cells_.items():
        half = "—" if c["half_width"] is None else f"{c['half_width']:.1f}"
        floor = "decided it" if c.get("floored") else ""
        lines.append(f"| {cell.label().replace(' seed=0', '')} | {c['seeds']} | {half} | "
                     f"{why.get(c['state'], c['state'])} | {floor} |")
    return [*lines, ""]


def csv_text(summary: dict) -> str:
    """summary.csv: the rows of every figure, one per cell, with a `figure` column."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for table in summary["figures"]:
        for r in table["rows"]:
            row = {k: r.get(k) for k in CSV_COLUMNS}
            row["figure"] = table["name"]
            row["accuracies"] = ";".join(f"{a:.6g}" for a in r["accuracies"])
            row["seeds"] = ";".join(str(s) for s in r["seeds"])
            for k in ("mean", "ci_low", "ci_high", "ci_half_width", "sd", "t", "article", "collapse_rate",
                      "collapse_ci_low", "collapse_ci_high", "not_collapsed_mean", "val_mean", "lr"):
                row[k] = "" if r.get(k) is None else f"{r[k]:.6g}"
            w.writerow(row)
    return buf.getvalue()
