"""Reading a sweep: its trial rows from the results store, and what one row says.

A row is a dict as the store gives it (catsdogs.store): its configuration's columns, its status
and its record, and the configuration again under "config" (rows written before a column
existed still have the value there: `field`). Everything below is a pure function of rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from catsdogs import schema
from catsdogs.errors import CatsdogsError
from catsdogs.optimizers import OPTIMIZERS
from catsdogs.store import Store

# The protocol columns of the store, and the values TrialConfig gives them by default.
PROTOCOL_DEFAULTS = schema.protocol_defaults()
# The article's protocol: every protocol field at its default. base_batch_size is left out: under
# the article's protocol it scales no learning rate and budgets no steps, so any value is the
# article's.
ARTICLE_PROTOCOL = {k: v for k, v in PROTOCOL_DEFAULTS.items() if k != "base_batch_size"}

OPTIMIZER_NAMES = {name: o.label for name, o in OPTIMIZERS.items()}
BACKEND_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX"}  # where a figure mixes backends


# --- loading ---------------------------------------------------------------------------------


def load_trials(store_path: Path | str, name: str) -> list[dict]:
    """Every trial of sweep `name` in the store at `store_path`, in the sweep's order."""
    store_path = Path(store_path)
    if not store_path.is_file():
        raise CatsdogsError(f"no results store at {store_path}: run `catsdogs sweep` first "
                            "(or give the --out it used)")
    with Store(store_path, read_only=True) as store, store.snapshot():
        names = store.sweeps()
        if name not in names:
            known = ", ".join(names) if names else "none yet"
            raise CatsdogsError(f"no sweep named {name!r} in {store_path}; sweeps there: {known}")
        return store.trials(name)


def sweep_config(store_path: Path | str, name: str) -> dict:
    """The sweep's resolved configuration as it recorded it (its plan, data, adaptive settings)."""
    with Store(store_path, read_only=True) as store:
        return store.sweep_config(name) or {}


def data_source_kind(config: dict) -> str | None:
    """'synthetic', 'url', 'zip' or 'folder': where a sweep's prepared data came from."""
    return ((config.get("data") or {}).get("source") or {}).get("kind")


# --- one trial's fields ----------------------------------------------------------------------


def field(trial: dict, key: str, default=None):
    """A configuration value: its store column, else the config dict, else `default`."""
    value = trial.get(key)
    if value is None:
        value = (trial.get("config") or {}).get(key)
    return default if value is None else value


def protocol_of(trial: dict) -> dict:
    """The trial's protocol settings, normalized (base_batch_size None where it has no effect)."""
    p = {k: field(trial, k, d) for k, d in PROTOCOL_DEFAULTS.items()}
    p["lr"] = None if p["lr"] is None else float(p["lr"])
    p["warmup_epochs"] = float(p["warmup_epochs"])
    p["accumulate"] = int(p["accumulate"])
    p["base_batch_size"] = int(p["base_batch_size"])
    if p["lr_scaling"] == "none" and p["budget"] == "epochs":
        p["base_batch_size"] = None  # it scales nothing and budgets nothing
    return p


def setting_of(trial: dict, name: str):
    """A TrialConfig field's value for the trial, its default where the trial predates the field;
    a process setting (schema.PROCESS_FIELDS) as a bool, or None (the store keeps 0 and 1)."""
    value = field(trial, name, schema.default(name))
    return bool(value) if name in schema.PROCESS_FIELDS and value is not None else value


def context_of(trial: dict) -> tuple:
    """What a trial ran in, beyond its protocol: epochs, image size, backend, and its process
    settings (determinism, TF32). Trials of two contexts never share a cell or a claim. A trial
    that trains until a target has no epochs of its context (None): its epochs only cap it, and
    trials capped apart (find-batch-size --race caps each by the leader's time) share their cells."""
    epochs = None if field(trial, "until") else field(trial, "epochs")
    return (epochs, field(trial, "image_size"),
            *(setting_of(trial, name) for name in ("backend", *schema.PROCESS_FIELDS)))


def many_contexts(trials) -> bool:
    """Whether a sweep's finished trials ran in more than one context: then every label of a
    context names its backend too (the one rule for every table, so labels match)."""
    return len({context_of(t) for t in trials if t.get("status") == schema.Status.DONE}) > 1


def context_label(context: tuple, many: bool) -> str:
    """"5 epochs, 200 px", and where a sweep has several contexts its backend and settings too."""
    epochs, size, backend, deterministic, tf32 = context
    label = f"{epochs} epochs, {size} px" if epochs is not None else f"to the target, {size} px"
    if many:
        label += f", {BACKEND_NAMES.get(backend, backend)}"
    return label + "".join(f", {text}" for text in schema.process_words(deterministic, tf32))


def per_context(trials: list[dict], results_of) -> list[dict]:
    """A claim's results in each context of a sweep's finished trials (done, with an accuracy),
    in the contexts' order, labelled by the one rule (`context_label`):
    [{"context", "results": results_of(context, its trials)}], a context without results left out."""
    contexts: dict[tuple, list[dict]] = {}
    for t in trials:
        if t.get("status") == schema.Status.DONE and accuracy(t) is not None:
            contexts.setdefault(context_of(t), []).append(t)
    many = many_contexts(trials)
    out = []
    for context, members in sorted(contexts.items(), key=lambda kv: str(kv[0])):
        results = results_of(context, members)
        if results:
            out.append({"context": context_label(context, many), "results": results})
    return out


def is_article_protocol(trial: dict, ignoring: tuple[str, ...] = ()) -> bool:
    """True for the article's protocol (ARTICLE_PROTOCOL): the trials of its two figures; with
    `ignoring`, whatever those settings are (a tuned sweep's learning rate, a target)."""
    p = protocol_of(trial)
    return all(p[k] == v for k, v in ARTICLE_PROTOCOL.items() if k not in ignoring)


def without_accumulate(p: dict) -> dict:
    """The protocol of the plain batch an accumulated one stands for."""
    q = dict(p, accumulate=1)
    if q["lr_scaling"] == "none" and q["budget"] == "epochs":
        q["base_batch_size"] = None
    return q


def protocol_label(p: dict, accumulate: bool = True) -> str:
    """A readable name: "article protocol", "linear lr scaling", "linear lr + equal updates"."""
    parts: list[tuple[str, str]] = []  # (alone, in a combination)
    if p["lr"] is not None:
        parts.append((f"lr {p['lr']:g}", f"lr {p['lr']:g}"))
    if p["lr_scaling"] == "linear":
        parts.append(("linear lr scaling", "linear lr"))
    elif p["lr_scaling"] != "none":
        parts.append((f"{p['lr_scaling']} lr scaling", f"{p['lr_scaling']} lr"))
    if p["budget"] == "steps":
        parts.append(("equal updates (steps budget)", "equal updates"))
    elif p["budget"] != "epochs":
        parts.append((f"{p['budget']} budget", f"{p['budget']} budget"))
    if p["warmup_epochs"]:
        parts.append((f"{p['warmup_epochs']:g}-epoch warm-up", f"{p['warmup_epochs']:g}-epoch warm-up"))
    if accumulate and p["accumulate"] > 1:
        parts.append((f"gradient accumulation ×{p['accumulate']}", f"accumulation ×{p['accumulate']}"))
    if p["precision"] != "float32":
        name = p["precision"].replace("_", " ")
        parts.append((name, name))
    if p["strategy"] != "none":
        parts.append((f"{p['strategy']} strategy", p["strategy"]))
    if not parts:
        label = "article protocol"
    elif len(parts) == 1:
        label = parts[0][0]
    else:
        label = " + ".join(short for _, short in parts)
    if p.get("base_batch_size") not in (None, PROTOCOL_DEFAULTS["base_batch_size"]):
        label += f", base batch {p['base_batch_size']}"
    return label


def accuracy(trial: dict) -> float | None:
    a = trial.get("test_accuracy")
    return None if a is None else float(a)


def validation_accuracy(trial: dict) -> float | None:
    """The trained model's validation accuracy: its column, else its history's last epoch."""
    v = trial.get("val_accuracy")
    if v is None:
        v = ((trial.get("history") or [{}])[-1] or {}).get("val_accuracy")
    return None if v is None else float(v)


def learning_rate_of(trial: dict) -> float:
    """The trial's base learning rate: its own, else its optimizer's Keras default."""
    lr = field(trial, "lr")
    return schema.DEFAULT_LR[field(trial, "optimizer")] if lr is None else float(lr)


def mean_of(values: Iterable[float | None]) -> float | None:
    v = [float(x) for x in values if x is not None]
    return sum(v) / len(v) if v else None


# --- the order of a figure's series: by the trials' data, never by their labels -------------------


def _rank(value, allowed: tuple) -> tuple:
    """Known values in their declared order, then any other value by itself."""
    return (allowed.index(value), "") if value in allowed else (len(allowed), str(value))


def protocol_order(p: dict) -> tuple:
    """The article's protocol first (every option at its default), then by option, in the order
    the schema declares them and their values."""
    return (p["lr"] is not None, p["lr"] or 0.0, _rank(p["lr_scaling"], schema.LR_SCALINGS),
            p["base_batch_size"] or 0, p["warmup_epochs"], _rank(p["budget"], schema.BUDGETS),
            p["accumulate"], _rank(p["precision"], schema.PRECISIONS), _rank(p["strategy"], schema.STRATEGIES))


def context_order(trial: dict) -> tuple:
    """Epochs, image size, backend (in the schema's order) and the data's fingerprint."""
    return (field(trial, "epochs", 0), field(trial, "image_size", 0),
            _rank(field(trial, "backend", schema.default("backend")), schema.BACKENDS), str(field(trial, "data", "")))


def trial_order(trial: dict, protocol: dict | None = None) -> tuple:
    """SGD before Adam, standard before augmented data, then the protocol, then the context."""
    return (_rank(field(trial, "optimizer"), schema.OPTIMIZERS), _rank(field(trial, "dataset"), schema.DATASETS),
            protocol_order(protocol_of(trial) if protocol is None else protocol), context_order(trial))
