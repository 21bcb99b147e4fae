"""A user's model, built and checked in a worker (the reference itself: catsdogs.model_ref).

`build(ref)` loads a saved `.keras` model (uncompiled: catsdogs compiles it with its own
optimizer) or imports `package.module:function` and calls it; every way that can fail is a
CatsdogsError of one line, which the parent shows as a usage error. `check` accepts a model of
images: one input of shape (height, width, channels), one output of shape (classes,) or (1,).
`loss_and_metrics` picks the loss from the last layer: width 1 is binary cross-entropy, width k > 1
sparse categorical cross-entropy over k classes, from probabilities where the last activation is
a sigmoid (softmax) and from logits otherwise; `--loss` names it instead. `describe` is what the
parent prints and records, with the model's FLOPs counted by its layers (`train_flops_per_image`).

Runs inside a worker, after its backend has started, so Keras is imported at the top.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
from dataclasses import dataclass

import keras
import numpy as np

from catsdogs.errors import CatsdogsError
from catsdogs.model_ref import is_file


def build(ref: str) -> keras.Model:
    """The model `ref` names, checked (`check`)."""
    if is_file(ref):
        try:
            model = keras.saving.load_model(ref, compile=False)
        except Exception as exc:  # noqa: BLE001 - any failure to load is the user's file
            raise CatsdogsError(f"--model {ref}: not a Keras model Keras can load: {_one_line(exc)}") from None
    else:
        module_name, function_name = ref.split(":")
        try:
            module = importlib.import_module(module_name)
        except SystemExit as exc:  # the module's own exit, not a crash of the worker (nor CUDA's)
            raise CatsdogsError(f"--model {ref}: importing {module_name} exited: sys.exit({exc.code!r})") from None
        except Exception as exc:  # noqa: BLE001 - an import that fails, however, is the user's module
            raise CatsdogsError(f"--model {ref}: cannot import {module_name}: {_one_line(exc)}") from None
        function = getattr(module, function_name, None)
        if not callable(function):
            raise CatsdogsError(f"--model {ref}: {module_name} has no function {function_name}")
        try:
            model = function()
        except SystemExit as exc:
            raise CatsdogsError(f"--model {ref}: {function_name}() exited: sys.exit({exc.code!r})") from None
        except Exception as exc:  # noqa: BLE001
            raise CatsdogsError(f"--model {ref}: {function_name}() raised {_one_line(exc)}") from None
    check(model, ref)
    return model


def check(model, ref: str) -> None:
    """A CatsdogsError unless `model` is a Keras model of images: one input (height, width,
    channels), one output (classes,)."""
    if not isinstance(model, keras.Model):
        raise CatsdogsError(f"--model {ref}: returned {type(model).__name__}, not a Keras model")
    try:
        model.inputs, model.outputs  # noqa: B018 - a Sequential without keras.Input has neither yet
    except (AttributeError, ValueError):
        raise CatsdogsError(f"--model {ref}: its input shape is not known: begin it with keras.Input(shape)") from None
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise CatsdogsError(f"--model {ref}: has {len(model.inputs)} inputs and {len(model.outputs)} outputs; "
                            "an image classifier has one of each")
    shape = tuple(model.inputs[0].shape)[1:]
    if len(shape) != 3 or not all(isinstance(d, int) and d > 0 for d in shape):
        raise CatsdogsError(f"--model {ref}: its input has shape {shape}; an image model takes "
                            "(height, width, channels), each known")
    out = tuple(model.outputs[0].shape)[1:]
    if len(out) != 1 or not isinstance(out[0], int) or out[0] < 1:
        raise CatsdogsError(f"--model {ref}: its output has shape {out}; a classifier's is (classes,) or (1,)")


@dataclass(frozen=True)
class LossChoice:
    """The loss a user's model trains with, and why."""

    kind: str  # binary or sparse-categorical
    from_logits: bool
    classes: int  # 2 for a binary model
    reason: str

    def describe(self) -> str:
        name = "binary cross-entropy" if self.kind == "binary" else f"sparse categorical cross-entropy over {self.classes} classes"
        return f"{name} from {'logits' if self.from_logits else 'probabilities'} ({self.reason})"


def choose_loss(model: keras.Model, loss: str = "auto") -> LossChoice:
    """The loss by the last layer's width and activation, or as `loss` names it (checked against it)."""
    width = int(model.outputs[0].shape[-1])
    last, hidden = _last_activation(model)
    _check_ending(width, last, hidden, loss)
    if loss == "auto":
        kind = "binary" if width == 1 else "sparse-categorical"
        said = f"the last layer's width is {width}"
    else:
        kind = loss
        said = f"--loss {loss}"
        if (kind == "binary") != (width == 1):
            need = "1" if kind == "binary" else "at least 2"
            raise CatsdogsError(f"--loss {loss}: needs a last layer of width {need}; this model's is {width}")
    probability = "sigmoid" if kind == "binary" else "softmax"
    from_logits = last != probability
    why = f"{said}, {'a ' + probability if not from_logits else 'no ' + probability} at its end"
    return LossChoice(kind, from_logits, 2 if kind == "binary" else width, why)


def _check_ending(width: int, last: str, hidden: str | None, loss: str) -> None:
    """A CatsdogsError naming --loss for an ending no loss trains right: a softmax over one unit
    (always 1), sigmoids over several (not one class among them), or values no rule can read."""
    if hidden:
        raise CatsdogsError(f"--loss {loss}: the model ends in {hidden}, whose output catsdogs cannot read as "
                            "probabilities or logits: end it in a Dense, Activation or Softmax layer")
    if width == 1 and last == "softmax":
        raise CatsdogsError(f"--loss {loss}: the model ends in a softmax over 1 unit, which is always 1 (nothing "
                            "to learn): end it in a sigmoid, or no activation, for two classes")
    if width > 1 and last == "sigmoid":
        raise CatsdogsError(f"--loss {loss}: the model ends in sigmoids over {width} units, each a probability of "
                            f"its own, not one class among {width}: end it in a softmax, or no activation")


def loss_and_metrics(choice: LossChoice):
    """Keras's loss and accuracy metric for `choice`, named as the article's ("accuracy")."""
    if choice.kind == "binary":
        return (keras.losses.BinaryCrossentropy(from_logits=choice.from_logits),
                [keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0 if choice.from_logits else 0.5)])
    return (keras.losses.SparseCategoricalCrossentropy(from_logits=choice.from_logits),
            [keras.metrics.SparseCategoricalAccuracy(name="accuracy")])


def describe(model: keras.Model, choice: LossChoice) -> dict:
    """What the parent prints and records of a user's model."""
    flops, unknown = train_flops_per_image(model)
    return {"name": model.name, "input_shape": list(model.inputs[0].shape[1:]),
            "train_flops_per_image": flops, "flops_unknown": unknown or None,
            "activation_bytes_per_image": activation_bytes(model), "article_size": article_size(model),
            "input_dtype": str(model.inputs[0].dtype), "classes": choice.classes,
            "parameters": int(model.count_params()), "layers": len(model.layers),
            "loss": choice.kind, "from_logits": choice.from_logits, "loss_description": choice.describe(),
            "dtype_policy": model.dtype_policy.name,
            "batch_norm": has_batch_norm(model)}


def architecture_digest(model: keras.Model, weights: bool = False) -> str:
    """A digest of what the model is: each layer's kind, configuration (its name left out: Keras
    numbers names by what the process built before) and weights' shapes, and with `weights` their
    values (a saved model's, which its trials start from; a function's are drawn from the trial's
    seed). Two builds of one function agree, and two saves of one model (a .keras file's bytes hold
    the time it was saved); a changed layer does not. What a race's trials are keyed by (TrialConfig.model)."""
    try:  # its wiring (which layer feeds which) and input layer, every name as its position
        config = model.get_config()
        named = {model.name: "#model"}
        for name in _layer_names(config):
            named.setdefault(name, f"#{len(named)}")
        wiring = _renamed(config, named)
    except Exception:  # noqa: BLE001 - a subclassed model without a config: its layers below say what they can
        wiring = None
    inputs = [[list(x.shape), str(x.dtype)] for x in model.inputs]
    layers = [inputs, wiring]
    for layer in _leaf_layers(model):
        try:
            config = {k: v for k, v in layer.get_config().items() if k != "name"}
        except Exception:  # noqa: BLE001 - a custom layer without a config: its kind and weights say it
            config = None
        layers.append([type(layer).__name__, config, [[*map(int, w.shape), str(w.dtype)] for w in layer.weights]])
    digest = hashlib.sha256(json.dumps(layers, sort_keys=True, default=lambda o: type(o).__name__).encode())
    for value in model.weights if weights else ():  # (default: no object's address in the text)
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(value)).tobytes())
    return digest.hexdigest()[:16]


def has_batch_norm(model: keras.Model) -> bool:
    """Whether any layer of `model`, nested models' included, is a BatchNormalization: then a
    micro-batch's gradient depends on its other images (the noise scale's micro-batches grow)."""
    return any(isinstance(layer, keras.layers.BatchNormalization) for layer in _leaf_layers(model))


# Layers whose multiply-adds are counted; every other layer with weights makes the count unknown.
# Weightless layers (activations, pooling, adds) and normalizations (a few operations a value)
# are left out, as the article's count leaves out its ReLUs, pooling and biases.
NORMALIZATIONS = (keras.layers.BatchNormalization, keras.layers.LayerNormalization,
                  keras.layers.GroupNormalization)


def train_flops_per_image(model: keras.Model) -> tuple[float | None, list[str]]:
    """(a training step's FLOPs an image, the kinds of layer with weights it could not count):
    the multiply-adds (2 FLOPs each) of every Dense, Conv2D, DepthwiseConv2D and SeparableConv2D,
    times 3 for the backward pass, as catsdogs.training.costs.train_flops_per_image counts the
    article's model (to which this comes to the same number: tests/training/test_user_model.py). None with
    the kinds of layer it does not know."""
    forward, unknown = 0.0, []
    for layer in _leaf_layers(model):
        out = layer.output.shape[1:] if layer.weights else None
        if isinstance(layer, keras.layers.Dense):
            forward += 2.0 * layer.kernel.shape[0] * layer.units * _positions(out)
        elif isinstance(layer, keras.layers.SeparableConv2D):
            kh, kw = layer.kernel_size
            channels = layer.depthwise_kernel.shape[2] * layer.depth_multiplier  # the pointwise step's input
            forward += 2.0 * (kh * kw * channels + channels * layer.filters) * _positions(out)
        elif isinstance(layer, keras.layers.DepthwiseConv2D):
            kh, kw = layer.kernel_size
            forward += 2.0 * kh * kw * layer.kernel.shape[2] * layer.depth_multiplier * _positions(out)
        elif isinstance(layer, keras.layers.Conv2D):
            forward += 2.0 * math.prod(layer.kernel.shape) * _positions(out)
        elif layer.weights and not isinstance(layer, NORMALIZATIONS):
            unknown.append(type(layer).__name__)
    return (None if unknown else 3.0 * forward), sorted(set(unknown))


def article_size(model: keras.Model) -> int | None:
    """The image size at which `model` is the article's model layer for layer (names aside: a
    saved copy of it, or a function returning it), else None. find-batch-size then predicts its
    memory with the article's own model of it (costs), so the generic path cannot drift from it."""
    from catsdogs.training.model import build_model

    height, width, channels = model.inputs[0].shape[1:]
    if height != width or channels != 3 or not isinstance(model, keras.Sequential):
        return None

    def layers_of(m) -> list:
        return [(layer["class_name"], {k: v for k, v in layer["config"].items() if k != "name"})
                for layer in m.get_config()["layers"]]

    return int(height) if layers_of(model) == layers_of(build_model(int(height))) else None


def activation_bytes(model: keras.Model) -> float:
    """The bytes of every layer's output for one image, at its compute dtype: what a training step
    keeps per image, roughly (find-batch-size sizes its second memory probe by it: costs.line_second_batch)."""
    total = 0.0
    for layer in _leaf_layers(model):
        shape = getattr(getattr(layer, "output", None), "shape", None)
        if shape is not None and all(isinstance(d, int) for d in shape[1:]):
            total += math.prod(shape[1:]) * np.dtype(layer.compute_dtype or "float32").itemsize
    return total


def _renamed(value, named: dict):
    """`value` (a model's config) with every string that is a layer's name as its position."""
    if isinstance(value, dict):
        return {k: _renamed(v, named) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_renamed(v, named) for v in value]
    return named.get(value, value) if isinstance(value, str) else value


def _layer_names(config):
    """The layers' names a model's config holds (an input layer's too, which a Sequential's
    `layers` leaves out), in the order they appear."""
    if isinstance(config, dict):
        if "class_name" in config and isinstance(config.get("config"), dict) and "name" in config["config"]:
            yield config["config"]["name"]
        for value in config.values():
            yield from _layer_names(value)
    elif isinstance(config, (list, tuple)):
        for value in config:
            yield from _layer_names(value)


def _leaf_layers(model):
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _leaf_layers(layer)
        else:
            yield layer


def _positions(shape) -> int:
    """The output positions a layer's kernel is applied at: the product of its output's leading
    dimensions (all but the last: a Conv2D's height x width, a Dense's 1 on a flat input)."""
    return math.prod(shape[:-1]) if shape is not None and len(shape) > 1 else 1


def _hides_its_output(layer) -> bool:
    """Whether a layer of no weights and no activation makes the model's output unreadable: a
    Lambda, or a layer of the user's own class, may compute anything (a softmax inside a Lambda was
    read as logits and given a second one). Keras's own (Dropout, Flatten, pooling, Average, ReLU
    ...) pass on what came before them, logits or probabilities: an all-convolutional classifier
    ends in global pooling."""
    return isinstance(layer, keras.layers.Lambda) or not type(layer).__module__.startswith("keras.")


def _last_activation(model: keras.Model) -> tuple[str, str | None]:
    """(the name of the activation the model ends with, '' for none: logits; the layer that
    hides it, or None): a layer's `activation`, a Softmax layer's own, or a nested model's last. A
    layer of no weights whose values catsdogs cannot tell (`_hides_its_output`) hides it."""
    for layer in reversed(model.layers):
        if isinstance(layer, keras.layers.Softmax):
            return "softmax", None
        if isinstance(layer, keras.Model):
            return _last_activation(layer)
        activation = getattr(layer, "activation", None)
        if activation is not None:
            return getattr(activation, "__name__", ""), None
        if layer.weights:  # a layer with weights and no activation: the output is its, a logit
            return "", None
        if _hides_its_output(layer):
            return "", f"{type(layer).__name__} {layer.name!r}"
    return "", None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
