"""The `catsdogs` command: options parsed, then one library call per command.

Every rule of a value lives with the library (catsdogs.schema, catsdogs.plans, each stage's own
checks) and raises a SettingError naming its key; `Command` turns it into a usage error naming
the option (exit 2). Every other error the user can fix (a failed download, a corrupt archive)
is one line and exit 1. No tracebacks.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from catsdogs import __version__, config, model_ref, plans, schema, targets
from catsdogs.cli_args import expand_variadic, refuse_repeats
from catsdogs.errors import CatsdogsError, Interrupted, SettingError, os_error_line
from catsdogs.measure.search import MODES as SEARCH_MODES
from catsdogs.measure.settings import FindSettings
from catsdogs.schema import PROTOCOL_FIELDS


class OneLineErrors(click.Group):
    """click prints usage errors over three lines; ours fit on one, and CatsdogsError too."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as e:
            where = f" (see `{e.ctx.command_path} --help`)" if e.ctx else ""
            click.echo(f"Error: {e.format_message()}{where}", err=True)
            sys.exit(2)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except click.Abort as e:  # Ctrl-C: said once, by what it stopped or here
            if not isinstance(e.__cause__, Interrupted):
                click.echo("Interrupted.", err=True)
            sys.exit(130)
        except SettingError as e:  # one that no command placed: a usage error all the same
            click.echo(f"Error: {e}", err=True)
            sys.exit(2)
        except CatsdogsError as e:
            click.echo(f"Error: {e}", err=True)
            if e.hint:  # what to do about it, on a line of its own
                click.echo(e.hint, err=True)
            sys.exit(1)
        except OSError as e:  # the filesystem's answer (a path that is a file, a read-only or full disk)
            click.echo(f"Error: {os_error_line(e)}", err=True)
            sys.exit(1)
        except sqlite3.DatabaseError as e:  # SQLite's, met outside the store's own guard
            click.echo(f"Error: the results store cannot be used: {e}", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


class Command(click.Command):
    """A catsdogs command: `--opt adam sgd` means `--opt adam --opt sgd` for options declared
    multiple=True, an option of one value given twice is refused (catsdogs.cli_args), and a
    SettingError from the library becomes a usage error naming the option its key stands for."""

    def parse_args(self, ctx, args):
        options = [p for p in self.params if isinstance(p, click.Option)]
        refuse_repeats(ctx, options, args)
        return super().parse_args(ctx, expand_variadic(options, args))

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SettingError as e:
            raise self.usage_error(ctx, e) from None
        except KeyboardInterrupt as e:  # Ctrl-C: to OneLineErrors as click's own, without its blank line
            raise click.Abort() from e

    def usage_error(self, ctx, e: SettingError) -> click.UsageError:
        """--batch-size's error for key batch_size when the value came from the command line; a
        value the command line did not give (a plan's, or a default) keeps the library's own words."""
        param = next((p for p in self.params if e.key and (p.name == e.key or f"--{e.key.replace('_', '-')}"
                                                            in getattr(p, "opts", ()))), None)
        from_plan = isinstance(e, plans.PlanError) and (param is None or not given(ctx, param.name))
        if param is None or from_plan or not given(ctx, param.name):  # a plan's value, or a default
            return click.UsageError(str(e), ctx)
        return click.BadParameter(getattr(e, "reason", str(e)), ctx, param)


class TrainingCommand(Command):
    """A command that trains: its Keras backend (KERAS_BACKEND) must be one catsdogs runs on and
    be installed, checked once its options parse (so --help always works), before any work."""

    def invoke(self, ctx):
        from catsdogs.training import backends

        backends.current()  # a CatsdogsError: one line, exit 1
        return super().invoke(ctx)


def given(ctx: click.Context, name: str) -> bool:
    """Whether the option `name` was given on the command line (or in the environment)."""
    return ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None)


# --- callbacks: a value's rule, from the library, at parse time -------------------------------------


def _checked(rule):
    """A click callback applying `rule(value)` (a SettingError becomes this option's error)."""
    def callback(ctx, param, value):
        if value is None:
            return None
        try:
            return rule(value)
        except SettingError as e:
            raise click.BadParameter(str(e), ctx, param) from None
    return callback


WORKERS_LIMIT = _checked(lambda v: schema.check_number(v, "workers"))


def _limited(ctx, param, value):
    """A whole number under its limit (schema.LIMITS, by the option's plan key)."""
    return _checked(lambda v: schema.check_number(v, param.name))(ctx, param, value)


def _memory(value: str) -> int:
    from catsdogs.measure.common import check_memory_limit, parse_memory

    return check_memory_limit(parse_memory(value))


def _source(value: str) -> str:
    from catsdogs.data.source import check_source

    return check_source(value)


def _print_version(ctx: click.Context, param, value) -> None:
    if not value or ctx.resilient_parsing:
        return
    from catsdogs.training import backends

    click.echo(f"catsdogs {__version__}: {backends.describe()}")
    ctx.exit()


def options(*decorators):
    """Apply option decorators in the order --help lists them."""
    def apply(f):
        for decorator in reversed(decorators):
            f = decorator(f)
        return f
    return apply


DATA_DIR = click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help=f"Where the prepared data lives [default: ${config.DATA_DIR_ENV} or "
                             f"./{config.DEFAULT_DATA_DIR}].")
ISOLATE = click.option("--isolate", is_flag=True,
                       help="Run each trial (or probe) in a fresh process, as catsdogs 0.2 did: slower "
                            "(every trial imports, loads its data and compiles again), for anyone who "
                            "wants no process reused.")


DETERMINISTIC = click.option("--deterministic/--no-deterministic", default=None,
                             help=schema.DETERMINISTIC_HELP)
TF32 = click.option("--tf32/--no-tf32", default=None, help=schema.TF32_HELP)
COMPILE_CACHE = click.option(
    "--compile-cache/--no-compile-cache", default=True, show_default=True,
    help="JAX: keep every compiled step in JAX's persistent compilation cache, in catsdogs/jax-compilation "
         "under the user's cache folder ($XDG_CACHE_HOME, else ~/.cache; $CATSDOGS_COMPILE_CACHE names "
         "another), so that running a plan again, even into a fresh --out, loads its steps instead of "
         "compiling them. Nothing on TensorFlow.")


def worker_env(compile_cache: bool) -> dict:
    """What the workers' environment adds for the command line's process options."""
    from catsdogs.training.backends import COMPILE_CACHE_ENV

    return {} if compile_cache else {COMPILE_CACHE_ENV: "off"}


def out_option(help: str):
    return click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path(config.DEFAULT_OUT),
                        show_default=True, help=help)


def name_option(default: str | None, help: str):
    return click.option("--name", default=default, show_default=default is not None,
                        callback=_checked(schema.check_run_name), help=help)


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
              callback=_checked(_source),
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
              callback=_checked(schema.parse_split),
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
    click.option("--opt", multiple=True, default=schema.OPTIMIZERS, show_default=True,
                 help="Optimizers, by Keras name: `--opt adam sgd` or `--opt adam --opt sgd`."),
    click.option("--batch-size", type=int, multiple=True, default=config.BATCH_SIZES, show_default=True,
                 help="Batch sizes: `--batch-size 16 32 64 128`."),
    click.option("--dataset", multiple=True, default=("standard",), show_default=True,
                 help="Data sets: standard, augmented (both: `--dataset standard augmented`)."),
    click.option("--seeds", type=click.IntRange(min=1), default=config.SEEDS, show_default=True,
                 help="Seeds per configuration (0, 1, ... N-1)."),
    click.option("--target-ci", type=float, default=None, metavar="W", help=TARGET_CI_HELP),
    click.option("--max-seeds", type=int, default=None, metavar="M",
                 help=f"The most seeds a cell gets with --target-ci [default: {config.MAX_SEEDS}]."),
    click.option("--epochs", type=click.IntRange(min=1), default=config.EPOCHS, show_default=True,
                 help="Epochs per trial."),
    click.option("--max-epochs", type=click.IntRange(min=1), default=None, metavar="M", callback=_limited,
                 help="With --until: the most epochs a trial trains when it does not reach its target "
                      "(the same number as --epochs, named for what it does there; give one)."),
    click.option("--noise-scale", is_flag=True, default=None, help=NOISE_SCALE_HELP),
    click.option("--eval-every", type=click.IntRange(min=1), default=None, metavar="N", callback=_limited,
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
    click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, callback=WORKERS_LIMIT,
                 help="Worker processes running trials at once: one per GPU where there are "
                      "GPUs, else each pinned to its share of the CPU cores. A worker runs trial "
                      "after trial, reusing decoded data and compiled training steps."),
    ISOLATE,
    COMPILE_CACHE,
    click.option("--runner", type=click.Choice(["local", "ray"]), default="local", show_default=True,
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
    from catsdogs.analysis.tensorboard_export import live
    from catsdogs.training.study import run_plan
    from catsdogs.training.sweep import succeeded

    # Without a plan every option counts, its default too; with one, only those given.
    counted = (lambda k: True) if values["plan"] is None else (lambda k: given(ctx, k))
    if values["max_epochs"] is not None:  # one cap: --max-epochs is --epochs' name with --until
        if given(ctx, "epochs"):
            raise click.UsageError("--max-epochs and --epochs both cap the trials: give one", ctx)
        counted = (lambda was: lambda k: k != "epochs" and was(k))(counted)
    grid = {k: _plan_value(values[k]) for k in plans.GRID_KEYS if counted(k) and values[k] not in (None, ())}
    top = {k: values[k] for k in ("seeds", "name", "target_ci", "max_seeds", "noise_scale", "eval_every",
                                  "max_epochs", *schema.PROCESS_FIELDS)
           if counted(k) and values[k] is not None}
    plan = plans.with_overrides(values["plan"] or plans.command_line_plan(), top, grid)
    counts = run_plan(plan, plans.data_dir(plan, values["data_dir"]), values["out"], runner=values["runner"],
                      workers=values["workers"] if given(ctx, "workers") else None, isolate=values["isolate"],
                      ray_address=values["ray_address"], worker_env=worker_env(values["compile_cache"]),
                      overwrite=values["overwrite"], retry_failed=values["retry_failed"],
                      dry_run=values["dry_run"], log=click.echo,
                      on_finished=live(values["tensorboard"] and not values["dry_run"], values["out"], plan.name))
    return 0 if counts.get("dry_run") or succeeded(counts, counts["trials"]) else 1


def _plan_value(value):
    return list(value) if isinstance(value, tuple) else value


# --- profile, find-batch-size -------------------------------------------------------------------


MEASUREMENT_OPTIONS = options(
    click.option("--opt", type=click.Choice(schema.OPTIMIZERS), default="adam", show_default=True,
                 help="Optimizer, by Keras name (so its default learning rate)."),
    click.option("--dataset", type=click.Choice(schema.DATASETS), default="standard", show_default=True,
                 help="Which prepared train split the batches are drawn from."),
    click.option("--precision", type=click.Choice(schema.PRECISIONS), default="float32",
                 show_default=True, help="Keras mixed-precision policy."),
    click.option("--memory-limit", callback=_checked(_memory), default=None, metavar="SIZE",
                 help="Memory cap per probe, like 4GiB or 4096MB (KiB/MiB/GiB binary, KB/MB/GB "
                      "decimal). CPU: the probe's peak resident memory; a probe that goes over is "
                      "stopped and recorded as out of memory. GPU: a logical device of that size."),
    DETERMINISTIC,
    TF32,
    DATA_DIR,
    out_option("Results go to OUT/NAME/."),
    ISOLATE,
    COMPILE_CACHE,
)


MODEL_OPTIONS = options(
    click.option("--model", default=None, metavar="MODEL",
                 help="Your model instead of the article's: a saved Keras model (PATH.keras) or a function "
                      "returning one (package.module:function, imported from the current directory). It runs "
                      "on the prepared data where it takes their images, else on random images of its input "
                      "shape (memory and speed do not depend on what the images show; the noise scale "
                      "does, and is measured only on real images)."),
    click.option("--data", "images", type=click.Path(path_type=Path), default=None, metavar="DIR",
                 help="With --model: your images, one subfolder per class (as "
                      "keras.utils.image_dataset_from_directory reads them), decoded and resized to the "
                      "model's input once. Default: the prepared data where they are its input, else random images."),
    click.option("--loss", type=click.Choice(model_ref.LOSSES), default="auto", show_default=True,
                 help="With --model: its loss. auto: binary cross-entropy for a last layer of width 1, "
                      "sparse categorical for width k > 1, from probabilities after a sigmoid or softmax, "
                      "else from logits."),
)


@cli.command(cls=TrainingCommand)
@click.option("--batch-size", type=int, multiple=True, default=(4, 8, 16, 32, 64, 128, 256, 512, 1024),
              show_default=True, help="Batch sizes: `--batch-size 4 8 16 32`.")
@click.option("--steps", type=int, default=20, show_default=True,
              help="Timed training steps per batch size, after the warm-up.")
@click.option("--warmup", type=int, default=2, show_default=True,
              help="Untimed warm-up steps (the first one traces and compiles).")
@click.option("--min-seconds", type=float, default=None, callback=_checked(lambda v: schema.check_number(v, "min_seconds", 0, float)),
              help="Time each batch size for at least this long, repeating its batches past --steps as "
                   "needed: NVML's utilization averages over up to a second, so a shorter probe reads a "
                   "number that means little [default: 2 on a GPU, 0 on the CPU].")
@MODEL_OPTIONS
@name_option("profile", "Name of the run: OUT/NAME/profile.csv and OUT/NAME/figures/.")
@MEASUREMENT_OPTIONS
def profile(batch_size, steps, warmup, min_seconds, model, images, loss, name, opt, dataset, precision, memory_limit,
            deterministic, tf32, data_dir, out, isolate, compile_cache):
    """Throughput, memory and utilization of the article's model (or yours, --model) at each batch size.

    Each batch size is a probe of the sweep's own training step: warm-up, then --steps timed
    steps on the prepared train split. A worker process is reused while the batch sizes grow
    (a worker's memory only grows) and replaced after an out-of-memory probe. Records the step
    time (median, mean), images/s, achieved FLOP/s and its share of the device's measured matmul
    peak (MFU), peak memory (on a GPU also NVML's utilization and memory, with the `nvml`
    extra). Out of memory is a recorded outcome. Writes OUT/NAME/profile.csv and figures (PNG,
    SVG) in OUT/NAME/figures/."""
    from catsdogs.api import profile as run

    rows = run.__wrapped__(model, batch_size, images, memory_limit=memory_limit, optimizer=opt, precision=precision,
                           steps=steps, warmup=warmup, loss=loss, name=name, out=out, data_dir=data_dir,
                           log=click.echo, dataset=dataset, min_seconds=min_seconds, isolate=isolate,
                           deterministic=deterministic is not False, tf32=tf32, worker_env=worker_env(compile_cache))
    return 1 if any(r["status"] == schema.Status.FAILED for r in rows) else 0


FIND = FindSettings()  # find-batch-size's defaults, which the options show


@cli.command("find-batch-size", cls=TrainingCommand)
@click.option("--mode", type=click.Choice(SEARCH_MODES), default=FIND.mode, show_default=True,
              help="power: double from --start until a probe runs out of memory; binsearch: then bisect "
                   "between the last size that fit and the first that did not.")
@click.option("--start", type=click.IntRange(min=1), default=FIND.start, show_default=True,
              help="First batch size (halved while it does not fit).")
@click.option("--max", "max_batch", type=click.IntRange(min=1), default=FIND.max_batch,
              help="Largest batch size to try (probed itself when doubling would pass it) [default: the "
                   "training split's images, the prepared data's or a --data folder's: no larger batch can "
                   "be trained on them; give --max to find the device's limit beyond them].")
@click.option("--margin", type=click.FloatRange(0, 1, max_open=True), default=FIND.margin, show_default=True,
              help="Safety fraction taken off the largest size that fits, then rounded down to a "
                   "multiple of 8 (a power of two below 8); 0 keeps the largest as is.")
@click.option("--steps", type=click.IntRange(min=1), default=FIND.steps, show_default=True,
              help="Timed training steps per probe, after one warm-up step; more where they take under "
                   f"{FIND.min_seconds:g} s, so a small batch's step time is steady enough to rank sizes by.")
@click.option("--resolution", type=click.IntRange(min=1), default=FIND.resolution,
              help="Stop bisecting when the gap is this small [default: 3% of the largest size "
                   "that fits, at least 8, at most an eighth of it].")
@click.option("--noise-scale/--no-noise-scale", "measure_noise", default=FIND.measure_noise, show_default=True,
              help="Before the search, measure the gradient noise scale (beyond which a larger batch buys "
                   "few steps) over epochs 2-3 of two short runs at batch size 32, in well under a minute at "
                   "64 px on a CPU; the recommendation then weighs each size's steps to a target against its "
                   "speed, and SGD's learning rate follows the paper's rule. --no-noise-scale skips it.")
@click.option("--seed", type=click.IntRange(min=0), default=FIND.seed, show_default=True,
              callback=_checked(lambda v: schema.check_number(v, "seed", least=0)),
              help="The noise scale's short runs train at this seed and the next (recorded in the JSON).")
@click.option("--from-store", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="OUT",
              help="Scale the printed learning rate from a rate tuned on this model and data: the results store "
                   "under OUT (a sweep's --out) of the critical plan (the rate that reached the target in fewest "
                   "steps) or the tuned plan (best validation accuracy), at the tuned batch size nearest the "
                   "recommendation, same optimizer, data set and image size. Default: Keras's default rate at "
                   "batch size 32.")
@click.option("--effective-batch", type=int, default=None, metavar="N",
              help="A batch size your training keeps (a recipe's): where it does not fit, the plan of "
                   "gradient accumulation that keeps it (micro-batches that fit, so many a step), in the "
                   "output and the JSON's hand_off.")
@MODEL_OPTIONS
@name_option(FIND.name, "Name of the run: OUT/NAME/find_batch_size.json and .csv.")
@MEASUREMENT_OPTIONS
def find_batch_size(mode, start, max_batch, margin, steps, resolution, measure_noise, seed, from_store, effective_batch,
                    model, images, loss, name, opt, dataset, precision, memory_limit, deterministic, tf32, data_dir, out,
                    isolate, compile_cache):
    """The largest batch size that fits, the fastest, the critical one, and which to train with.

    Every probe is a few steps of the sweep's own training step at one batch size; one that
    runs out of memory ends its worker process, so it cannot poison the next. Prints the
    measured answer beside the memory model's, the gradient noise scale, and the batch size
    predicted to reach a target soonest (its steps by the noise scale times its step time),
    naming the limit that binds (memory, speed, statistics), with a learning rate by the optimizer's
    rule. Without --memory-limit a GPU's own memory is the cap, on the CPU 90% of what is available."""
    from catsdogs.api import find_batch_size as run

    search = dict(mode=mode, margin=margin, steps=steps, resolution=resolution, dataset=dataset, isolate=isolate,
                  deterministic=deterministic is not False, tf32=tf32, worker_env=worker_env(compile_cache),
                  effective_batch=effective_batch)
    if max_batch is None or click.get_current_context().get_parameter_source("start").name != "DEFAULT":
        search["start"] = start  # (--max alone: the search starts no higher than it)
    run.__wrapped__(model, images, memory_limit=memory_limit, optimizer=opt, max_batch_size=max_batch, seed=seed,
                    precision=precision, noise_scale=measure_noise, loss=loss, from_store=from_store, name=name,
                    out=out, data_dir=data_dir, log=click.echo, **search)


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
@click.option("--source", default=None, callback=_checked(_source),
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
