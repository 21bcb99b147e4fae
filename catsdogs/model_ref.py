"""A user's model by reference, as the command line names it: no framework here.

`--model` takes either a saved Keras model (`PATH.keras`) or a function that returns one
(`package.module:function`, imported in the worker from the current directory and the Python
path). This module only reads the text: `parse` returns the canonical reference (a file's
absolute path, or the function's name as given) or a SettingError naming `model`; `source`
records what the reference was at the time (a file's SHA-256, so a result is traceable to the
very model it measured). Importing the module, building the model and checking it happen in a
worker (catsdogs.training.user_model), as every framework call does.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from catsdogs.errors import SettingError

FUNCTION = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
LOSSES = ("auto", "binary", "sparse-categorical")  # --loss: auto reads the model's last layer
FORMS = "a saved model (PATH.keras) or a function returning one (package.module:function)"


def parse(text: str) -> str:
    """The canonical reference: an existing .keras file's absolute path, or `module:function`."""
    text = (text or "").strip()
    if text.endswith(".keras"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise SettingError(f"no such file: {text} (expected {FORMS})", "model")
        return str(path.resolve())
    if FUNCTION.match(text):
        return text
    raise SettingError(f"{text!r} is neither a saved model (PATH.keras) nor a function returning one "
                       "(package.module:function)", "model")


def is_file(ref: str) -> bool:
    return ref.endswith(".keras")


def source(ref: str) -> dict:
    """What the reference named when it was measured: the file and its SHA-256, or the function."""
    if not is_file(ref):
        return {"model": ref, "kind": "function"}
    digest = hashlib.sha256()
    with open(ref, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"model": ref, "kind": "file", "sha256": digest.hexdigest()}


# A race's trials on a user's folder: its data, with a tenth of the training part validating
# (catsdogs.data.folder.race_splits): TrialConfig.data is the folder's fingerprint and this.
RACE_SPLIT = "+validation"


def trial_model(source: dict, name: str | None, architecture: str | None) -> str:
    """What a user's model's trials are keyed by (TrialConfig.model), from what its check found
    (`source`: this module's, the name and the layers' digest, user_model.architecture_digest): a
    function's reference, or a saved model's name, then the digest (a saved one's covers its
    weights, which its trials start from), so an edited model is another model and one saved again
    (the Python API saves a keras.Model to a new file each call) the same."""
    return f"{source['model'] if source.get('kind') == 'function' else name}@{architecture}"


def check_loss(loss: str | None) -> str:
    loss = loss or "auto"
    if loss not in LOSSES:
        raise SettingError(f"unknown loss {loss!r}; choose from {', '.join(LOSSES)}", "loss")
    return loss
