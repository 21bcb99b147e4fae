"""One collapse figure over several sweeps of a store: the README's, which sets the article's
protocol beside the remedy (Adam with a 1-epoch warm-up) run as a sweep of its own.

    python scripts/collapse_figure.py --out-dir outputs --sweeps article-64px remedy \\
        --figure outputs/readme/collapse

Prints the table it draws (rate, Wilson interval, accuracy of the runs that did not collapse).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from catsdogs import config
from catsdogs import report as rp
from catsdogs.figures import save_figure


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=Path(config.DEFAULT_OUT), help="where results.sqlite is")
    p.add_argument("--sweeps", nargs="+", required=True)
    p.add_argument("--figure", type=Path, required=True, help="path without extension (.png and .svg)")
    p.add_argument("--note", default="synthetic data")
    a = p.parse_args()
    trials = {}
    for name in a.sweeps:
        for t in rp.load_trials(a.out_dir / config.STORE_FILE, name):
            trials[t["key"]] = t  # a trial two sweeps share counts once
    table = rp.collapse_table(list(trials.values()))
    fig, _ = rp.make_collapse_figure(table, a.note)
    paths = save_figure(fig, a.figure)
    print("\n".join(rp.collapse_markdown(table)[6:]))
    print(f"-> {paths['png']} (and .svg)")


if __name__ == "__main__":
    main()
