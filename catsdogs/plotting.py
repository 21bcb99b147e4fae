"""What every figure shares: the log2 batch-size axis, and PNG and SVG files written atomically.

The report's figures (catsdogs.analysis.plots) and the profile's (catsdogs.measure.figures) are
drawn by functions that take a matplotlib axis and a table, on a `Figure` they build themselves:
no pyplot, no global state.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from catsdogs.files import write_atomic

BATCH_LABEL = "batch size (log2 scale)"
BATCH_AXIS_PAD = 2**0.45  # room left and right of the outermost batch sizes, a factor on the axis


def batch_axis(ax, sizes: Iterable[float], label: str = BATCH_LABEL) -> None:
    """Batch size on a log2 axis: each size a labelled tick, no minor ticks."""
    sizes = sorted({int(s) for s in sizes})
    ax.set_xscale("log", base=2)
    if sizes:
        ax.set_xticks(sizes, labels=[str(s) for s in sizes])
        ax.set_xlim(min(sizes) / BATCH_AXIS_PAD, max(sizes) * BATCH_AXIS_PAD)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(label)


def save_figure(fig: Figure, stem: Path) -> dict[str, Path]:
    """stem.png (150 dpi) and stem.svg, each written atomically."""
    paths = {}
    for fmt in ("png", "svg"):
        kwargs = {"dpi": 150} if fmt == "png" else {"metadata": {"Date": None}}
        paths[fmt] = write_atomic(stem.with_suffix(f".{fmt}"),
                                  lambda tmp, fmt=fmt, kw=kwargs: fig.savefig(tmp, format=fmt, **kw))
    return paths
