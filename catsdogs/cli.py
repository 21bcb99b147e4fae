"""The `catsdogs` command: options parsed, then one library call per command (the measuring
commands, profile and find-batch-size, in catsdogs.cli_measure; what every command shares, its
click classes and common options, in catsdogs.cli_options).

Every rule of a value lives with the library (catsdogs.schema, catsdogs.plans, each stage's own
checks) and raises a SettingError naming its key; `Command` turns it into a usage error naming
the option (exit 2). Every other error the user can fix (a failed download, a corrupt archive)
is one line and exit 1. No tracebacks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from catsdogs import config, plans, schema, targets
from catsdogs.cli_measure import find_batch_size, profile
from catsdogs.cli_options import (
    COMPILE_CACHE,
    DATA_DIR,
    DETERMINISTIC,
    ISOLATE,
    TF32,
    WORKERS_LIMIT,
    Command,
    OneLineErrors,
    TrainingCommand,
    checked,
    given,
    kw,
    limited,
    name_option,
    options,
    out_option,
    worker_env,
)
from catsdogs.cli_options import source as _source
from catsdogs.errors import CatsdogsError
from catsdogs.schema import PROTOCOL_FIELDS
from catsdogs.version import __version__


def _print_version(ctx: click.Context, param, value) -> None:
    if not value or ctx.resilient_parsing:
        return
    from catsdogs.runtime import backends

    click.echo(f"catsdogs {__version__}: {backends.describe()}")
    ctx.exit()


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]},
             invoke_without_command=True)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print catsdogs's version and the Keras backend it would train on, then exit.")
@click.pass_context
def cli(ctx):
    """Which batch size should I train with, and what does it cost in accuracy, speed, memory?

    Reproduces the cats-vs-dogs case study of "How to maximize GPU utilization by finding the
    right batch size" with Keras 3. Start with `catsdogs reproduce --config quick`: the whole
    article small and offline in about a minute; `catsdogs reproduce` runs it in full, and
    `catsdogs plans` lists the other plans. Data goes to ./data, results to ./outputs.

    The stages, each a command: prepare (the data) -> sweep (training) -> report (figures and
    claims); profile and find-batch-size answer the title question on this device.

    Trains on Keras's TensorFlow backend, or on JAX with KERAS_BACKEND=jax (Keras's own
    switch); every result records its backend, and two backends' results never share a cell."""
    if ctx.invoked_subcommand is None:  # bare `catsdogs`: what it does, not an error
        click.echo(ctx.get_help())


# --- prepare ----------------------------------------------------------------------------------


@cli.command(cls=Command)
@click.option("--source", default=config.ARCHIVE_URL, show_default="Microsoft's PetImages archive URL",
              callback=checked(_source),
              help="Archive URL, a local .zip, an extracted PetImages folder, or 'synthetic' "
                   "(a generated stand-in, for offline use and tests).")
@click.option("--sha256", default=config.ARCHIVE_SHA256, show_default="the published hash",
              help="SHA-256 the archive must have.")
@click.option("--no-verify", is_flag=True,
              help="Skip the SHA-256 check (says so, and records the actual hash in the manifest).")
@DATA_DIR
@click.option("--per-class", type=int, default=config.PER_CLASS, show_default=True,
              help="Valid images chosen per class.")
@click.option("--split", default=",".join(map(str, config.SPLIT)), show_default=True,
              callback=checked(schema.parse_split),
              help="Per-class train,validation,test counts; must add up to --per-class.")
@click.option("--size", type=int, default=config.IMAGE_SIZE, show_default=True,
              help="Side of the square images, in pixels.")
@click.option("--seed", type=int, default=config.SEED, show_default=True,
              help="Seed of the choice of images and of their split.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@click.option("--force", is_flag=True,
              help="Rebuild every folder from the source, even when they are already prepared as asked.")
def prepare(source, sha256, no_verify, data_dir, per_class, split, size, seed, quiet, force):
    """Download, verify, extract, validate, split, resize and augment the images.

    Idempotent: the same parameters again check every prepared file against the manifest and
    rebuild only those that changed since (nothing, usually). Writes data/standard/,
    data/augmented/ and data/manifest.json (the record of every choice, every rejected file and
    each file's SHA-256)."""
    from catsdogs.data.prepare import prepare as run

    if no_verify:
        click.echo("Warning: SHA-256 verification skipped (--no-verify).", err=True)
    run(source=source, data_dir=data_dir, sha256=None if no_verify else sha256,
        per_class=per_class, split=split, size=size, seed=seed, log=click.echo,
        progress=not quiet and sys.stderr.isatty(), force=force)


# --- sweep ----------------------------------------------------------------------------------


def _protocol_option(name: str):
    """A sweep option for a protocol field, everything about it from catsdogs.schema."""
    choices = schema.allowed_values(name)
    default = schema.default(name)
    kind = click.Choice(choices) if choices else schema.python_type(name)
    if schema.multiple(name):  # `--lr 0.001 0.002`: every value crossed with the grid
        return click.option("--" + name.replace("_", "-"), type=kind, multiple=True, default=(),
                            help=schema.option_help(name))
    return click.option("--" + name.replace("_", "-"), type=kind, default=default,
                        show_default=default is not None, help=schema.option_help(name))


class PlanType(click.ParamType):
    """A plan: a built-in plan's name (`catsdogs plans`) or a TOML file's path, read and checked."""

    name = "PLAN"

    def convert(self, value, param, ctx):
        if isinstance(value, plans.Plan):
            return value
        try:
            return plans.load(str(value))
        except CatsdogsError as e:
            self.fail(str(e), param, ctx)


NOISE_SCALE_HELP = ("Record each trial's gradient noise scale B_simple (McCandlish et al. 2018: the "
                    "batch size beyond which a larger batch buys few steps), with its 95% interval, at "
                    "the start and after every epoch, from "
                    f"{config.NOISE_PAIRS * config.NOISE_MICROS * config.NOISE_MICRO} images' gradients "
                    "drawn apart from training: the trial trains exactly as without it, and its time is in no epoch's "
                    "clock. Not part of a trial's identity: finished trials are not run again for it "
                    "(--overwrite does). The report draws it (figure `noise`) and tests its prediction.")
TARGET_CI_HELP = ("Adaptive seeds: keep adding seeds (round by round, seed-major) to every cell whose "
                  "95% interval of test accuracy is wider than ±W percentage points, until it meets W "
                  "or has --max-seeds seeds. --seeds is where every cell starts.")


def _renamed_backend(ctx, param, value):
    """--backend local|ray, catsdogs 0.6's name for --runner, taken with a notice by 0.7 and gone
    since 0.8: a usage error that says what to write instead."""
    if value is not None:
        raise click.UsageError(f"--backend {value} is now --runner {value} (where trials run; the Keras "
                               "backend is KERAS_BACKEND's)", ctx)
    return value


@cli.command(cls=TrainingCommand)
@options(
    click.option("--opt", multiple=True, default=schema.ARTICLE_OPTIMIZERS, show_default=True,
                 help="Optimizers, by Keras name: `--opt adam sgd` or `--opt adam --opt sgd`."),
    click.option("--batch-size", type=int, multiple=True, default=config.BATCH_SIZES, show_default=True,
                 help="Batch sizes: `--batch-size 16 32 64 128`."),
    click.option("--dataset", multiple=True, default=("standard",), show_default=True,
                 help="Data sets: standard, augmented (both: `--dataset standard augmented`)."),
    click.option("--seeds", type=kw("seeds"), default=config.SEEDS, show_default=True,
                 help="Seeds per configuration (0, 1, ... N-1)."),
    click.option("--target-ci", type=float, default=None, metavar="W", help=TARGET_CI_HELP),
    click.option("--max-seeds", type=int, default=None, metavar="M",
                 help=f"The most seeds a cell gets with --target-ci [default: {config.MAX_SEEDS}]."),
    click.option("--epochs", type=kw("epochs"), default=config.EPOCHS, show_default=True,
                 help="Epochs per trial."),
    click.option("--max-epochs", type=kw("max_epochs"), default=None, metavar="M", callback=limited,
                 help="With --until: the most epochs a trial trains when it does not reach its target "
                      "(the same number as --epochs, named for what it does there; give one)."),
    click.option("--noise-scale", is_flag=True, default=None, help=NOISE_SCALE_HELP),
    click.option("--eval-every", type=kw("eval_every"), default=None, metavar="N", callback=limited,
                 help=targets.EVAL_EVERY_HELP),
    DETERMINISTIC,
    TF32,
    name_option("sweep", "Name of the sweep: its CSV and figures go to OUT/NAME/."),
    click.option("--config", "plan", type=PlanType(), default=None,
                 help="A plan: a built-in plan's name (`catsdogs plans`) or a TOML file's path. Its "
                      "grids, seeds, epochs, name and data_dir are the sweep's; an option given on "
                      "the command line wins (a grid option, like --opt, in every grid)."),
    *(_protocol_option(name) for name in PROTOCOL_FIELDS),
    DATA_DIR,
    out_option("Where the results store and each sweep's folder go."),
    click.option("--overwrite", is_flag=True, help="Run finished trials again (resuming is the default)."),
    click.option("--retry-failed", is_flag=True, help="Run failed and out-of-memory trials again."),
    click.option("--dry-run", is_flag=True, help="List the planned trials and their status, and whether a run "
                 "would refuse them (a batch larger than the training split); run nothing."),
    click.option("--workers", type=kw("workers"), default=1, show_default=True, callback=WORKERS_LIMIT,
                 help="Worker processes running trials at once: one per GPU where there are "
                      "GPUs, else each pinned to its share of the CPU cores. A worker runs trial "
                      "after trial, reusing decoded data and compiled training steps."),
    ISOLATE,
    COMPILE_CACHE,
    click.option("--runner", type=kw("runner"), default="local", show_default=True,
                 help="Where trials run: local: worker processes on this machine; ray: Ray actors "
                      "(one GPU, or CPU cores, each) on the cluster at --ray-address, else a local "
                      "Ray (the catsdogs[ray] extra); --workers then defaults to what the cluster "
                      "runs at once. What trains them is Keras's backend, KERAS_BACKEND's choice."),
    click.option("--backend", "old_runner", type=click.Choice(["local", "ray"]), default=None, hidden=True,
                 expose_value=False,
                 callback=_renamed_backend, help="Old name of --runner (catsdogs 0.6), gone since 0.8."),
    click.option("--ray-address", default=None,
                 help="Ray cluster to run on, e.g. auto or ray://head:10001 [default: $RAY_ADDRESS, "
                      "else a local Ray started for the sweep]. The prepared data must be at the same "
                      "path on every node."),
    click.option("--tensorboard", is_flag=True,
                 help="Keep OUT/NAME/tensorboard/ current as trials finish: each trial a TensorBoard run in "
                      "the HParams dashboard's format, as `report --tensorboard` writes it (pip install "
                      "'catsdogs[tensorboard]'). Watch with tensorboard --logdir OUT/NAME/tensorboard."),
)
@click.pass_context
def sweep(ctx, **values):
    """Train the article's model over optimizers x batch sizes x datasets x seeds.

    With no other options, `catsdogs sweep --opt adam sgd` runs the article's first figure:
    batch sizes 16-128, standard data, 5 epochs, 3 seeds. Trials run in long-lived worker processes that
    reuse decoded data and compiled steps (with identical results); a trial that fails or runs out of memory
    takes its worker with it, and the next gets a fresh one. Each outcome (done, failed, oom) goes to
    OUT/results.sqlite and OUT/NAME/results.csv. Run the same command again to resume."""
    from catsdogs.api import PLAN_OVERRIDES
    from catsdogs.api import sweep as run
    from catsdogs.plans.options import from_options
    from catsdogs.training.sweep import succeeded

    # Without a plan every option counts, its default too; with one, only those given.
    counted = (lambda k: True) if values["plan"] is None else (lambda k: given(ctx, k))
    if values["max_epochs"] is not None:  # one cap: --max-epochs is --epochs' name with --until
        if given(ctx, "epochs"):
            raise click.UsageError("--max-epochs and --epochs both cap the trials: give one", ctx)
        counted = (lambda was: lambda k: k != "epochs" and was(k))(counted)
    grid = {k: _plan_value(values[k]) for k in plans.GRID_KEYS if counted(k) and values[k] not in (None, ())}
    top = {k: values[k] for k in PLAN_OVERRIDES if counted(k) and values[k] is not None}
    plan = from_options(values["plan"], top, grid)
    counts = run.__wrapped__(plan, data_dir=values["data_dir"], out=values["out"], runner=values["runner"],
                             workers=values["workers"] if given(ctx, "workers") else None, isolate=values["isolate"],
                             ray_address=values["ray_address"], worker_env=worker_env(values["compile_cache"]),
                             overwrite=values["overwrite"], retry_failed=values["retry_failed"],
                             dry_run=values["dry_run"], tensorboard=values["tensorboard"], log=click.echo)
    return 0 if counts.get("dry_run") or succeeded(counts, counts["trials"]) else 1


def _plan_value(value):
    return list(value) if isinstance(value, tuple) else value


cli.add_command(profile)
cli.add_command(find_batch_size)


# --- report ---------------------------------------------------------------------------------


@cli.command(cls=Command)
@name_option("sweep", "The sweep to report on, as given to `catsdogs sweep --name`.")
@out_option("Where the results store is; the report goes to OUT/NAME/.")
@click.option("--title-note", default=None,
              help="Added to every figure's title and to results.md, e.g. 'synthetic data'.")
@click.option("--export-store", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Also write the whole results store to FILE as one self-contained SQLite file, with "
                   "what its write-ahead log (results.sqlite-wal) holds: the way to copy or archive a store.")
@click.option("--find-batch-size", "find_results", multiple=True, metavar="FILE",
              type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="find-batch-size's result (its find_batch_size.json; repeat for several) to hold against "
                   "the sweep's trials run until a target: measured time to the target beside the predicted, "
                   "and the recommendation's cost. Default: every OUT/*/find_batch_size.json; each is matched to "
                   "the series of its optimizer, data, image size and backend.")
@click.option("--tensorboard", is_flag=True,
              help="Also write every trial as a TensorBoard run in the HParams dashboard's format, to "
                   "OUT/NAME/tensorboard/ (only trials that changed since the last export; needs "
                   "pip install 'catsdogs[tensorboard]'): tensorboard --logdir OUT/NAME/tensorboard.")
def report(name, out, title_note, export_store, find_results, tensorboard):
    """Figures and tables of a sweep, read from OUT/results.sqlite (no TensorFlow), and for trials run
    until a target find-batch-size's answer held against them (its find_batch_size.json).

    Writes OUT/NAME/figures/optimizers and augmentation (the article's two figures: every
    seed, the mean and a 95% confidence interval, the article's own values as stars), and
    protocols, accumulation, tuned and collapse when the sweep has such trials, each as PNG and
    SVG; plus OUT/NAME/results.md (with the article's claims and their verdicts) and
    OUT/NAME/summary.csv. Failed, out-of-memory and unfinished trials are counted and shown,
    never dropped. Safe to run while a sweep is running: it opens the store read-only and changes
    nothing in it."""
    from catsdogs.api import report as run

    run.__wrapped__(name, out=out, note=title_note, find_results=list(find_results) or None, tensorboard=tensorboard,
                    export_store=export_store, log=click.echo)


# --- reproduce ------------------------------------------------------------------------------


@cli.command(cls=TrainingCommand)
@click.option("--config", "plan", type=PlanType(), default=plans.DEFAULT_PLAN, show_default=True,
              help="The plan: a built-in plan's name or a TOML file's path. `catsdogs plans` lists "
                   "the built-in ones: article is the article's full protocol, quick a one-minute "
                   "offline run.")
@click.option("--source", default=None, callback=checked(_source),
              help="Override the plan's source (URL, .zip, extracted folder, 'synthetic').")
@click.option("--seeds", type=click.IntRange(min=1), default=None, help="Override the plan's seeds per point.")
@click.option("--target-ci", type=float, default=None, metavar="W",
              help=TARGET_CI_HELP + " Overrides the plan's target_ci.")
@click.option("--max-seeds", type=int, default=None, metavar="M",
              help=f"The most seeds a cell gets with a target [default: the plan's max_seeds, else {config.MAX_SEEDS}].")
@click.option("--noise-scale", is_flag=True, default=None,
              help=NOISE_SCALE_HELP + " Overrides the plan's noise_scale.")
@DETERMINISTIC
@TF32
@name_option(None, "Override the plan's name (the sweep; outputs in OUT/NAME/).")
@DATA_DIR
@out_option("Where the results store and the sweep's folder go.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, callback=WORKERS_LIMIT,
              help="Trials run at once (see `catsdogs sweep --help`).")
@ISOLATE
@COMPILE_CACHE
@click.option("--overwrite", is_flag=True, help="Run finished trials again (resuming is the default).")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def reproduce(plan, source, seeds, target_ci, max_seeds, noise_scale, deterministic, tf32, name, data_dir, out,
              workers, isolate, compile_cache, overwrite, quiet):
    """The whole article in one command: prepare, the plan's grids, report.

    Trials the two figures share run once; run it again to resume. Figures and tables land
    in OUT/NAME/ (see `catsdogs report --help`), the prepared images in the plan's data_dir
    (else ./data)."""
    from catsdogs.reproduce import reproduce as run
    from catsdogs.training.sweep import succeeded

    top = {k: v for k, v in (("seeds", seeds), ("name", name), ("target_ci", target_ci), ("max_seeds", max_seeds),
                             ("noise_scale", noise_scale), ("deterministic", deterministic), ("tf32", tf32))
           if v is not None}
    plan = plans.with_overrides(plan, top, {})
    result = run(plan, data_dir=plans.data_dir(plan, data_dir), out=out, source=source, workers=workers,
                 isolate=isolate, overwrite=overwrite, log=click.echo, progress=not quiet and sys.stderr.isatty(),
                 worker_env=worker_env(compile_cache))
    return 0 if succeeded(result["counts"], result["trials"]) else 1


# --- plans ----------------------------------------------------------------------------------


@cli.command("plans", cls=Command)
@click.argument("plan", type=PlanType(), required=False)
def list_plans(plan):
    """The built-in plans: what each runs and how long it takes. With PLAN, its TOML.

    A plan is what `catsdogs reproduce --config PLAN` prepares, trains and reports on, and
    `catsdogs sweep --config PLAN` trains (on data already prepared). To write your own, start
    from one: `catsdogs plans quick > my.toml`, edit it, then `--config my.toml`. The format is
    in docs/usage.md ("Plans"); an unknown key or a bad value is an error naming it."""
    if plan is not None:
        click.echo(plan.text, nl=False)
        return 0
    click.echo("\n".join(plans.listing()))


main = cli

if __name__ == "__main__":  # pragma: no cover
    main()
