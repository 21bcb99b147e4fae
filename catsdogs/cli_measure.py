"""The commands that measure this device: `catsdogs profile` and `catsdogs find-batch-size`,
each its options parsed, then the library's core the Python API calls too (catsdogs.api:
`find_result`; `profile` as `__wrapped__`), whose SettingError the command names by the option
(`--max`), not the keyword argument (`max_batch_size`).
"""

from __future__ import annotations

from pathlib import Path

import click

from catsdogs import schema
from catsdogs.cli_options import (
    COMPILE_CACHE,
    DATA_DIR,
    DETERMINISTIC,
    ISOLATE,
    TF32,
    TrainingCommand,
    checked,
    kw,
    memory,
    name_option,
    options,
    out_option,
    worker_env,
)
from catsdogs.measure.settings import FindSettings

MEASUREMENT_OPTIONS = options(
    click.option("--opt", type=kw("optimizer"), default="adam", show_default=True,
                 help="Optimizer, by Keras name (so its default learning rate)."),
    click.option("--dataset", type=kw("dataset"), default="standard", show_default=True,
                 help="Which prepared train split the batches are drawn from."),
    click.option("--precision", type=kw("precision"), default="float32",
                 show_default=True, help="Keras mixed-precision policy."),
    click.option("--memory-limit", callback=checked(memory), default=None, metavar="SIZE",
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
    click.option("--loss", type=kw("loss"), default="auto", show_default=True,
                 help="With --model: its loss. auto: binary cross-entropy for a last layer of width 1, "
                      "sparse categorical for width k > 1, from probabilities after a sigmoid or softmax, "
                      "else from logits."),
)


@click.command(cls=TrainingCommand)
@click.option("--batch-size", type=int, multiple=True, default=(4, 8, 16, 32, 64, 128, 256, 512, 1024),
              show_default=True, help="Batch sizes: `--batch-size 4 8 16 32`.")
@click.option("--steps", type=kw("steps"), default=20, show_default=True,
              help="Timed training steps per batch size, after the warm-up.")
@click.option("--warmup", type=kw("warmup"), default=2, show_default=True,
              help="Untimed warm-up steps (the first one traces and compiles).")
@click.option("--min-seconds", type=float, default=None, callback=checked(lambda v: schema.check_number(v, "min_seconds", 0, float)),
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


@click.command("find-batch-size", cls=TrainingCommand)
@click.option("--mode", type=kw("mode"), default=FIND.mode, show_default=True,
              help="power: double from --start until a probe runs out of memory; binsearch: then bisect "
                   "between the last size that fit and the first that did not.")
@click.option("--start", type=kw("start"), default=FIND.start, show_default=True,
              help="First batch size (halved while it does not fit).")
@click.option("--max", "max_batch", type=kw("max_batch_size"), default=FIND.max_batch,
              help="Largest batch size to try (probed itself when doubling would pass it) [default: the "
                   "training split's images, the prepared data's or a --data folder's: no larger batch can "
                   "be trained on them; give --max to find the device's limit beyond them].")
@click.option("--margin", type=kw("margin"), default=FIND.margin, show_default=True,
              help="Safety fraction taken off the largest size that fits, then rounded down to a "
                   "multiple of 8 (a power of two below 8); 0 keeps the largest as is.")
@click.option("--steps", type=kw("steps"), default=FIND.steps, show_default=True,
              help="Timed training steps per probe, after one warm-up step; more where they take under "
                   f"{FIND.min_seconds:g} s, so a small batch's step time is steady enough to rank sizes by "
                   f"(at {FIND.steps}, its default, one near the limit on JAX on the CPU, where the first step's peak is the probe's).")
@click.option("--resolution", type=kw("resolution"), default=FIND.resolution,
              help="Stop bisecting when the gap is this small [default: 3% of the largest size "
                   "that fits, 5% on the CPU (a resident set's noise), at least 8, at most an "
                   "eighth of it].")
@click.option("--noise-scale/--no-noise-scale", "measure_noise", default=FIND.measure_noise, show_default=True,
              help="Before the search, measure the gradient noise scale (beyond which a larger batch buys "
                   "few steps) after epoch 2 of four short runs at batch size 32, at the rate the learning-rate "
                   "rule anchors on (the best of three a first run tries), in well under a minute at "
                   "64 px on a CPU; the recommendation then weighs each size's steps to a target against its "
                   "speed, and SGD's learning rate follows the paper's rule. --no-noise-scale skips it.")
@click.option("--seed", type=kw("seed"), default=FIND.seed, show_default=True,
              callback=checked(lambda v: schema.check_number(v, "seed", least=0)),
              help="The noise scale's four short runs train at this seed and the next three, the first of them "
                   "the learning rate's test too (recorded in the JSON).")
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
@click.option("--race", is_flag=True, default=FIND.race,
              help="After the search, race the sizes that fit (a factor-2 grid of at most 8, each at its rule's "
                   "learning rate, half and twice it) to a validation target on the same seeds, by successive "
                   "halving (2, 6, 18 seeds), and answer with the measured fastest, the prediction beside it. Its "
                   "trials are a sweep in the results store, NAME-race: Ctrl-C and the same command continue it. "
                   "A model of yours (--model) races on real images: with --data, a tenth of its training images "
                   "held out to validate. Minutes on a GPU, about ten on two CPU cores at 64 px.")
@click.option("--race-budget", type=float, default=FIND.race_budget, metavar="SECONDS",
              help="The race's time, at most: a rung that would pass it (estimated from the trials so far) is "
                   "not started, and the answer is the last whole rung's [default: every rung].")
@click.option("--until", default=FIND.until, metavar="METRIC=VALUE",
              help="The race's target, as a sweep's --until takes it (val_loss=0.49, val_accuracy=0.8) [default: "
                   "the validation loss a reference run at the learning rate's anchor reaches in 3 epochs].")
@click.option("--workers", "race_workers", type=kw("race_workers"), default=FIND.race_workers,
              help="The race's trials at once, each in a worker process (or Ray actor) of its own [default: 1; "
                   "with --runner ray, what the cluster runs at once].")
@click.option("--runner", "race_runner", type=kw("race_runner"), default=FIND.race_runner, show_default=True,
              help="Where the race's trials run, as a sweep's do: local: worker processes on this machine; ray: "
                   "Ray actors (one GPU, or CPU cores, each) on the cluster at --ray-address, else a local Ray "
                   "(the catsdogs[ray] extra). The probes run here either way.")
@click.option("--ray-address", default=FIND.ray_address,
              help="The Ray cluster the race runs on, e.g. auto or ray://head:10001 [default: $RAY_ADDRESS, else "
                   "a local Ray]. The data (the prepared data, or a --data folder's decoded copy under OUT/NAME) "
                   "must be at the same path on every node.")
@MODEL_OPTIONS
@name_option(FIND.name, "Name of the run: OUT/NAME/find_batch_size.json and .csv.")
@MEASUREMENT_OPTIONS
def find_batch_size(mode, start, max_batch, margin, steps, resolution, measure_noise, seed, from_store, effective_batch,
                    race, race_budget, until, race_workers, race_runner, ray_address,
                    model, images, loss, name, opt, dataset, precision, memory_limit, deterministic, tf32, data_dir, out,
                    isolate, compile_cache):
    """The largest batch size that fits, the fastest, the critical one, and which to train with.

    Every probe is a few steps of the sweep's own training step at one batch size; one that
    runs out of memory ends its worker process, so it cannot poison the next. Prints the
    measured answer beside the memory model's, the gradient noise scale, and the batch size
    predicted to reach a target soonest (its steps by the noise scale times its step time),
    naming the limit that binds (memory, speed, statistics), with a learning rate by the optimizer's
    rule. Without --memory-limit a GPU's own memory is the cap, on the CPU 90% of what is available."""
    from catsdogs.api import find_result

    search = dict(mode=mode, margin=margin, steps=steps, resolution=resolution, dataset=dataset, isolate=isolate,
                  deterministic=deterministic is not False, tf32=tf32, worker_env=worker_env(compile_cache),
                  effective_batch=effective_batch, race=race, race_budget=race_budget, until=until,
                  race_workers=race_workers, race_runner=race_runner, ray_address=ray_address)
    if max_batch is None or click.get_current_context().get_parameter_source("start").name != "DEFAULT":
        search["start"] = start  # (--max alone: the search starts no higher than it)
    find_result(model, images, memory_limit=memory_limit, optimizer=opt, max_batch_size=max_batch, seed=seed,
                precision=precision, noise_scale=measure_noise, loss=loss, from_store=from_store, name=name,
                out=out, data_dir=data_dir, log=click.echo, **search)
