"""A plan from a sweep's options: the one way the command line's `sweep` and the Python API's
`catsdogs.sweep` build what they run."""

from __future__ import annotations

from catsdogs import config, schema
from catsdogs.plans import Plan, load, with_overrides


def from_options(plan: str | Plan | None, top: dict, grid: dict, origin: str = "the command line") -> Plan:
    """The plan a sweep runs: `plan` (a built-in plan's name, a TOML file or a Plan; None: one grid,
    which the defaults fill: the article's optimizers, batch sizes 16-128, standard data, 5 epochs,
    3 seeds, named "sweep"), with `top` replacing its top-level keys (seeds, name, target_ci ...)
    and `grid` its grids' keys (opt, batch_size, epochs ...); `origin` names them in an error."""
    if plan is None:
        top = {"name": "sweep", "seeds": config.SEEDS, **top}
        grid = {"opt": list(schema.ARTICLE_OPTIMIZERS), "batch_size": list(config.BATCH_SIZES),
                "dataset": ["standard"], **({} if "max_epochs" in top else {"epochs": config.EPOCHS}), **grid}
        return with_overrides(Plan({"grids": {"sweep": {}}}, origin), top, grid)
    base = plan if isinstance(plan, Plan) else load(plan)
    return with_overrides(base, top, grid) if top or grid else base
