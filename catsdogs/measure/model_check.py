"""A user's model (--model) before the probes: built and checked in a worker of its own, and the
data its probes run on. Framework-free, as profile's and find-batch-size's own processes are.

`check_user_model` runs catsdogs.training.user_model in a fresh worker that ends with it (so what
building the model allocated never counts in a probe's peak) and returns what it found: input
shape, classes, parameters and the loss it will train with. A model that cannot be imported,
built or used is a SettingError naming the option (`--model`, or `--loss`): a usage error, exit 2.

`data_for` decides what the probes train on: the prepared data where the model takes its images
(size x size x 3), else random images of the model's input shape and labels of its classes.
Memory and speed do not depend on what the pixels show, so they need no real data; the output
says which it used.
"""

from __future__ import annotations

import re
from pathlib import Path

from catsdogs.errors import SettingError
from catsdogs.manifest import load_manifest, require_intact
from catsdogs.messages import ModelCheckTask, ModelInfo
from catsdogs.model_ref import check_loss, parse
from catsdogs.schema import Status
from catsdogs.training.worker import run_isolated

_OPTION = re.compile(r"^(?:CatsdogsError: )?--(model|loss) (\S+): ")


def check_user_model(model: str, loss: str, log_path: Path, env: dict | None) -> tuple[str, ModelInfo]:
    """(the canonical reference, what the worker found), or a SettingError of one line."""
    ref, loss = parse(model), check_loss(loss)
    record: ModelInfo = run_isolated(ModelCheckTask(ref, loss), log_path, env)
    if record.status == Status.DONE:
        log_path.unlink(missing_ok=True)
        return ref, record
    line = (record.error or "the worker ended without a word").strip().splitlines()[0]
    said = _OPTION.match(line)
    if said:
        raise SettingError(f"{said.group(2)}: {line[said.end():]}", said.group(1))
    raise SettingError(f"{model}: {line} (log: {log_path})", "model")


def data_for(info: ModelInfo, data_dir: Path) -> tuple[dict | None, list | None, str]:
    """(the prepared data's manifest or None, the probes' `random_images` or None, a sentence
    saying which): the prepared data when they are the model's input, else random images."""
    height, width, channels = info.input_shape
    manifest = load_manifest(Path(data_dir))
    size = manifest["params"]["size"] if manifest else None
    if manifest and (height, width, channels) == (size, size, 3):
        require_intact(Path(data_dir))
        return manifest, None, f"the prepared data in {data_dir} ({size} px)"
    why = (f"the prepared data are {size} x {size} x 3" if manifest else f"no prepared data in {data_dir}")
    return None, [height, width, channels, info.classes, info.input_dtype], (
        f"random images {height} x {width} x {channels} ({info.input_dtype}) and labels of {info.classes} classes "
        f"({why}; memory and speed do not depend on what the images show)")


def describe(info: ModelInfo) -> str:
    """One line: the model, its size and its loss."""
    return (f"model {info.name}: {info.parameters:,} parameters, {info.layers} layers, input "
            f"{' x '.join(map(str, info.input_shape))}; {info.loss_description}")
