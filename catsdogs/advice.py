"""find-batch-size's answer as a Python value: `BatchSizeAdvice`, what `catsdogs.find_batch_size`
returns, a view of the command's typed result (catsdogs.find_result.FindResult, which *is*
find_batch_size.json: the store is the contract, so `to_json` and `from_json` round-trip the file,
and an advice loaded from an older run's file is the same value the run returned).

The fields a training script needs are named on the value (`batch_size`, `learning_rate`,
`largest_fitting`, `fastest`, `noise_scale` ...); the whole result is `result`, and the file's
object `summary`. `plot(ax)` draws the predicted time to a target by batch size on a matplotlib
axis. No framework is imported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from catsdogs.find_result import FindResult


@dataclass(frozen=True, eq=False)
class BatchSizeAdvice:
    """Which batch size to train with, and why: find-batch-size's answer.

    Example:
        >>> advice = catsdogs.find_batch_size(model, (x, y), memory_limit="4GiB")
        >>> advice.batch_size, advice.learning_rate
        (24, 0.0026)
        >>> model.fit(x, y, batch_size=advice.batch_size)
    """

    batch_size: int | None  # the race's measured fastest, else the least predicted time to a target (None: nothing fits)
    learning_rate: float | None  # for it, by `learning_rate_rule` from the anchor the summary names
    learning_rate_rule: str | None  # "linear" (SGD), "sqrt" (Adam), ...; "raced": the race measured it
    binding: str | None  # what set the recommendation: "statistics", "speed", "memory", "data", "max"
    largest_fitting: int | None  # the largest batch size that fits in memory (measured)
    stopped_by: str | None  # what ended the search: "memory", "data", "max" or "failures"
    margin_batch_size: int | None  # the largest, less the safety margin, confirmed by a probe
    fastest: int | None  # the batch size of the most images a second, of those that fit
    noise_scale: float | None  # B_simple, the gradient noise scale (None: not measured)
    noise_interval: tuple[float | None, float | None] | None  # its 95% interval (None above: open)
    near_best: tuple[int, ...]  # the sizes whose worst-case time is within 10% of the recommendation's
    eval_batch_size: int | None  # an evaluation batch that fits: the largest training one (no gradients held)
    accumulation: dict | None  # for an effective batch kept: {"effective_batch_size", "micro_batch_size", "steps"}
    table: tuple[dict, ...] = field(repr=False)  # each probed size: step time, predicted relative time ...
    result: FindResult = field(repr=False)  # find_batch_size.json, whole and typed
    # the prediction's choice (the least predicted time to a target): batch_size's too without a race
    predicted_batch_size: int | None = None
    predicted_learning_rate: float | None = None
    # with --race (race=True): the measured fastest is batch_size and learning_rate; its steady
    # seconds to the race's target (the median over its seeds) with their 95% interval (None above:
    # open), and the other sizes the race cannot tell from it (within 1.25x)
    race_seconds: tuple[float, float, float | None] | None = None
    race_tied: tuple[int, ...] = ()

    @classmethod
    def of(cls, result: FindResult) -> BatchSizeAdvice:
        """The advice a find-batch-size result gives."""
        rec = result.recommendation or {}
        noise = result.noise_scale or {}
        hand = result.hand_off or {}
        interval = (noise.get("low"), noise.get("high")) if noise.get("b_simple") is not None else None
        raced = (result.race or {}).get("decision") or {}
        measured = dict(race_seconds=(raced["seconds"], raced["seconds_low"], raced.get("seconds_high")),
                        race_tied=tuple(sorted({t["batch_size"] for t in raced.get("tied") or ()} - {raced["batch_size"]}))
                        ) if raced else {}
        return cls(batch_size=raced.get("batch_size", rec.get("batch_size", result.margin_batch_size)),
                   learning_rate=raced.get("lr", rec.get("learning_rate")),
                   learning_rate_rule="raced" if raced else rec.get("learning_rate_rule"),
                   binding=rec.get("binding"), largest_fitting=result.largest_fitting,
                   stopped_by=result.stopped_by, margin_batch_size=result.margin_batch_size,
                   fastest=(result.fastest or {}).get("batch_size"), noise_scale=noise.get("b_simple"),
                   noise_interval=interval, near_best=tuple(rec.get("near_best") or ()),
                   eval_batch_size=hand.get("eval_batch_size", result.largest_fitting),
                   accumulation=hand.get("accumulation"), table=tuple(rec.get("table") or ()), result=result,
                   predicted_batch_size=rec.get("batch_size"), predicted_learning_rate=rec.get("learning_rate"),
                   **measured)

    @classmethod
    def from_summary(cls, summary: dict) -> BatchSizeAdvice:
        """The advice in find_batch_size.json's object (checked: catsdogs.find_result)."""
        return cls.of(FindResult.from_dict(summary))

    @property
    def summary(self) -> dict:
        """find_batch_size.json's object, whole."""
        return self.result.to_dict()

    def to_json(self, indent: int | None = 2) -> str:
        """The answer as find_batch_size.json holds it (strict JSON: no NaN)."""
        return self.result.to_json(indent)

    @classmethod
    def from_json(cls, source: str | Path) -> BatchSizeAdvice:
        """The advice from find_batch_size.json's text, or from the file at a Path; CatsdogsError, in
        one line, for a file that is not find-batch-size's answer (checked: catsdogs.find_result)."""
        return cls.of(FindResult.from_json(source))

    def __eq__(self, other) -> bool:
        return isinstance(other, BatchSizeAdvice) and self.to_json() == other.to_json()

    __hash__ = None  # a value of mutable parts: compared, never hashed

    def __repr__(self) -> str:
        def num(v) -> str:
            return "open" if v is None else f"{v:.3g}"

        parts = [f"batch_size={self.batch_size}"]
        if self.learning_rate is not None:
            how = "measured in the race" if self.race_seconds else f"{self.learning_rate_rule} rule"
            parts.append(f"learning_rate={self.learning_rate:.3g} ({how})")
        if self.race_seconds:
            parts.append(f"race_seconds={self.race_seconds[0]:.3g} [{num(self.race_seconds[1])}, "
                         f"{num(self.race_seconds[2])}], predicted_batch_size={self.predicted_batch_size}")
        if self.binding:
            parts.append(f"binding={self.binding!r}")
        parts.append(f"largest_fitting={self.largest_fitting} ({self.stopped_by})")
        if self.fastest is not None:
            parts.append(f"fastest={self.fastest}")
        if self.noise_scale is not None:
            low, high = self.noise_interval or (None, None)
            parts.append(f"noise_scale={self.noise_scale:.3g} [{num(low)}, {num(high)}]")
        if self.accumulation:
            a = self.accumulation
            parts.append(f"accumulation={a['steps']} x {a['micro_batch_size']} = {a['effective_batch_size']}")
        return f"BatchSizeAdvice({', '.join(parts)})"

    def plot(self, ax=None):
        """The predicted time to a target by batch size, relative to the least (log axes): at the
        noise scale's estimate, and its worst case over the interval; the recommendation ringed.
        Draws on `ax` (a new figure's when None) and returns it."""
        if ax is None:
            from matplotlib.figure import Figure

            ax = Figure(figsize=(6, 4), layout="constrained").subplots()
        rows = [r for r in self.table if r.get("relative_time") is not None and math.isfinite(r["relative_time"])]
        if not rows:
            ax.text(0.5, 0.5, "no predicted times: the noise scale was not measured", ha="center",
                    va="center", transform=ax.transAxes)
            return ax
        sizes = [r["batch_size"] for r in rows]
        ax.plot(sizes, [r["relative_time"] for r in rows], "o-", label=f"at B_noise {self.noise_scale:.3g}")
        worst = [r for r in rows if r.get("worst_case") is not None]
        if worst:
            ax.plot([r["batch_size"] for r in worst], [r["worst_case"] for r in worst], "s--", color="0.4",
                    markersize=4, label="worst case over its interval")
        chosen = next((r for r in rows if r["batch_size"] == self.batch_size), None)
        if chosen:
            ax.scatter([chosen["batch_size"]], [chosen.get("worst_case") or chosen["relative_time"]], s=220,
                       facecolors="none", edgecolors="C3", linewidths=1.6, zorder=5,
                       label=f"recommended: {self.batch_size}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("predicted time to a target / the least")
        ax.grid(True, alpha=0.25)
        ax.legend(fontsize=8, frameon=False)
        return ax
