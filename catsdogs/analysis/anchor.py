"""The tuned learning rates a store holds, for find-batch-size's learning rate to start from
(`find-batch-size --from-store OUT`). Reads the store; no framework.

A learning-rate rule (catsdogs.lr_rules.RULES) scales a rate from one batch size to another; it
says nothing of the rate to start from. Keras's default is a guess; a rate tuned on this model
and data is a measurement. Two kinds of sweep tune one per batch size:

- **critical** (trials run until a target, the `critical` plan): at each batch size the rate that
  reached the target in the fewest steps (catsdogs.analysis.to_target's S(B)). Preferred: it
  chose by time to a target, which is what find-batch-size's recommendation minimises;
- **tuned** (several rates at a batch size, the `tuned` plan): the rate with the best mean
  validation accuracy (catsdogs.analysis.tuning).

Only the article's protocol counts (no warm-up, accumulation or other scaling: its rate would be a
different quantity), on the same optimizer, data set and image size as the search. Among several
such sweeps, the critical kind first, then the one with the most batch sizes, then by name.
"""

from __future__ import annotations

import math
from pathlib import Path

from catsdogs.analysis import to_target
from catsdogs.analysis.rows import field, is_article_protocol
from catsdogs.analysis.tuning import tune_learning_rates
from catsdogs.errors import SettingError
from catsdogs.manifest import require_prepared
from catsdogs.schema import Status
from catsdogs.store import Store, store_path

KINDS = ("critical", "tuned")  # in order of preference


def rates_of(trials: list[dict]) -> dict[str, dict]:
    """{kind: {"rates": {batch size: tuned rate}, "edges": [batch sizes whose rate is at its grid's
    edge]}} for the kinds these trials tune (one optimizer, data set and size)."""
    out: dict[str, dict] = {}
    # one series each (a context: epochs, backend, ...), the one that tuned the most batch sizes
    targeted = [t for t in trials if to_target.has_target(t)]
    series = [[r for r in table["rows"] if math.isfinite(r["steps"]) and len(r["rates"]) > 1]
              for table in to_target.tables(targeted)]
    rows = max(series, key=len, default=[])
    if rows:
        out["critical"] = {"rates": {r["batch_size"]: r["lr"] for r in rows},
                           "edges": [r["batch_size"] for r in rows if r["edge"]]}
    by_series: dict[str, list[dict]] = {}
    for c in tune_learning_rates([t for t in trials if not to_target.has_target(t)])["choices"]:
        if c["chosen"]:
            by_series.setdefault(c["series"], []).append(c)
    choices = max(by_series.values(), key=len, default=[])
    if choices:
        out["tuned"] = {"rates": {c["batch_size"]: c["lr"] for c in choices},
                        "edges": [c["batch_size"] for c in choices if c["edge"]]}
    return out


def tuned_anchor(out: Path | str, optimizer: str, dataset: str, image_size: int) -> dict:
    """The tuned rates of the store under `out` for `optimizer` on `dataset` at `image_size`:
    {"store", "sweep", "kind", "rates": {batch size: rate}, "edges"}. A SettingError (the option
    --from-store) when there is no store or no sweep that tunes them."""
    path = store_path(out)
    if not path.is_file():
        raise SettingError(f"no results store at {path}: give the --out of a sweep of the tuned or critical plan",
                           "from_store")
    candidates = []
    with Store(path, read_only=True) as store, store.snapshot():
        for sweep in store.sweeps():
            trials = [t for t in store.trials(sweep)
                      if t.get("status") == Status.DONE and field(t, "optimizer") == optimizer
                      and field(t, "dataset") == dataset and field(t, "image_size") == image_size
                      and field(t, "model") is None  # (a user's model's race tunes its own rates, not the article's)
                      and is_article_protocol(t, ignoring=("lr", "until"))]
            for kind, found in rates_of(trials).items():
                candidates.append({"store": str(path), "sweep": sweep, "kind": kind, **found})
    if not candidates:
        raise SettingError(f"no sweep in {path} tunes the learning rate of {optimizer} on {dataset} data at "
                           f"{image_size} px (several rates at a batch size, the article's protocol otherwise): "
                           "run the tuned or critical plan there", "from_store")
    return min(candidates, key=lambda c: (KINDS.index(c["kind"]), -len(c["rates"]), c["sweep"]))


def anchor_for(out: Path | str, optimizer: str, dataset: str, data_dir: Path | str) -> dict:
    """`tuned_anchor` at the image size of the prepared data in `data_dir`."""
    return tuned_anchor(out, optimizer, dataset, require_prepared(Path(data_dir))["params"]["size"])
