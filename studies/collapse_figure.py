"""One collapse figure over several sweeps of a store: the README's, which sets the article's
protocol beside the remedy (Adam with a 1-epoch warm-up) run as a sweep of its own.

    python studies/collapse_figure.py --out-dir outputs --sweeps article-64px remedy \\
        --figure outputs/readme/collapse

Prints the table it draws (rate, Wilson interval, accuracy of the runs that did not collapse).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from catsdogs import config
from catsdogs.analysis.markdown import collapse_markdown
from catsdogs.analysis.plots import make_collapse_figure
from catsdogs.analysis.rows import load_trials
from catsdogs.analysis.tables import collapse_table
from catsdogs.plotting import save_figure
from catsdogs.store import store_path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=Path(config.DEFAULT_OUT), help="where results.sqlite is")
    p.add_argument("--sweeps", nargs="+", required=True)
    p.add_argument("--figure", type=Path, required=True, help="path without extension (.png and .svg)")
    p.add_argument("--note", default="synthetic data")
    a = p.parse_args()
    trials = {}
    for name in a.sweeps:
        for t in load_trials(store_path(a.out_dir), name):
            trials[t["key"]] = t  # a trial two sweeps share counts once
    table = collapse_table(list(trials.values()))
    fig, _ = make_collapse_figure(table, a.note)
    paths = save_figure(fig, a.figure)
    print("\n".join(collapse_markdown(table)[6:]))
    print(f"-> {paths['png']} (and .svg)")


if __name__ == "__main__":
    main()
