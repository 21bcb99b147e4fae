"""The article's model, and what it costs: parameters, FLOPs, memory."""

from __future__ import annotations

import keras
from keras import layers


def build_model(size: int = 200) -> keras.Sequential:
    """Conv2D(32) -> MaxPool -> Flatten -> Dense(128) -> Dense(1): the article's network.

    Images come in as uint8 and are scaled by 1/255 inside the model, as the article's
    ImageDataGenerator(rescale=1/255) did on the host: a quarter of the bytes cross to the
    device, and the layer has no weights, so the parameter count is the article's.

    The last layer's sigmoid is folded into the loss (`loss_and_metrics`: from logits), so the model outputs
    the logit. That is what the article's TensorFlow did with its sigmoid output: Keras on
    TensorFlow recovers the logit behind a sigmoid and computes the cross-entropy from it. Keras on
    JAX cannot: it clips the saturated probability, whose gradient is then zero, and every Adam
    trial at the article's learning rate collapsed to chance there (synthetic 64 px, 2 seeds)."""
    return keras.Sequential(
        [
            keras.Input((size, size, 3), dtype="uint8"),
            layers.Rescaling(1.0 / 255),
            layers.Conv2D(32, (3, 3), activation="relu", kernel_initializer="he_uniform", padding="same"),
            layers.MaxPooling2D((2, 2)),
            layers.Flatten(),
            layers.Dense(128, activation="relu", kernel_initializer="he_uniform"),
            layers.Dense(1, dtype="float32"),  # the logit; float32 under mixed precision too
        ],
        name="article_cnn",
    )


def loss_and_metrics():
    """The article's loss and metric for a model that outputs the logit: binary cross-entropy of
    the sigmoid, accuracy of sigmoid > 0.5 (logit > 0)."""
    return (keras.losses.BinaryCrossentropy(from_logits=True),
            [keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0)])


def parameter_count(size: int = 200) -> int:
    """Closed form of build_model(size).count_params(); 40,961,153 at 200 px."""
    flat = (size // 2) * (size // 2) * 32
    return (3 * 3 * 3 * 32 + 32) + (flat * 128 + 128) + (128 + 1)


def train_flops_per_image(size: int = 200) -> float:
    """Floating-point operations of one training step, per image (multiply-add = 2 FLOPs).

    The backward pass costs about twice the forward pass (gradients for inputs and weights);
    the first layer needs no input gradient, which this ignores (it overestimates by <1%)."""
    conv = 2 * size * size * (3 * 3 * 3) * 32
    flat = (size // 2) * (size // 2) * 32
    dense = 2 * flat * 128 + 2 * 128
    return 3.0 * (conv + dense)


# --- memory: an analytic model of one training step ---------------------------------------------
# Bytes, by part. The prediction of the largest batch size that fits is
#     fixed + per_image x batch <= cap,
# where `per_image` comes from the architecture alone (below) and `fixed` is the model's state
# (weights, gradients, optimizer slots) plus a runtime baseline (TensorFlow, CUDA/oneDNN
# workspaces, the data held in memory, allocator slack) measured with a probe at a tiny batch
# size: baseline = measured peak - state - per_image x tiny batch. Nothing per image is fitted.

OPTIMIZER_SLOTS = {"sgd": 0, "adam": 2}  # float32 tensors of the weights' shape: Adam's m and v
CPU_PIPELINE_BATCHES = 2  # input batches besides the one in the step that live in host memory:
# the prefetched one and the one being gathered (profile's pipeline prefetches one batch)


def _activation_bytes(precision: str) -> int:
    return 2 if precision.startswith("mixed") else 4


def state_bytes(size: int = 200, optimizer: str = "adam", precision: str = "float32") -> dict[str, int]:
    """Batch-independent tensors: weights, their gradients, the optimizer's slots
    (and under mixed precision the float16 copy of the weights each step casts)."""
    p = parameter_count(size)
    parts = {"weights": 4 * p, "gradients": 4 * p, "optimizer_slots": 4 * p * OPTIMIZER_SLOTS[optimizer]}
    if precision.startswith("mixed"):
        parts["weights_cast"] = 2 * p
    return parts


def activation_moments(size: int = 200, precision: str = "float32") -> dict[str, dict[str, int]]:
    """Per image, the activation tensors live at each candidate peak moment of a training step.

    A tensor lives from the op that writes it to the last op that reads it. The uint8 batch
    lives through the whole step (it is the step's argument); the rescaled float input until
    the convolution's weight gradient has read it; the ReLU output until ReluGrad (which reads
    the ReLU output, not its input, so the convolution's pre-activation output dies in the
    forward pass); the pooled output (Flatten only reshapes it) until MaxPoolGrad. Backward
    temporaries: the gradient reaching the pooled output, MaxPoolGrad's full-resolution
    output, and ReluGrad's output, a new buffer (TensorFlow's ReluGrad, oneDNN's included,
    does not overwrite its input), read by the bias and weight gradients. The Dense layers'
    128-wide activations are a rounding error and left out."""
    a = _activation_bytes(precision)
    px, pooled = size * size, (size // 2) * (size // 2)
    uint8, rescaled = 3 * px, 3 * px * a
    full, half = 32 * px * a, 32 * pooled * a  # one 32-channel map, before and after pooling
    return {
        "forward: relu": {"input_uint8": uint8, "rescaled_input": rescaled, "conv_output": full,
                          "relu_output": full},
        "backward: max-pool gradient": {"input_uint8": uint8, "rescaled_input": rescaled,
                                        "relu_output": full, "pool_output": half,
                                        "grad_pool_output": half, "grad_relu_output": full},
        "backward: relu gradient": {"input_uint8": uint8, "rescaled_input": rescaled, "relu_output": full,
                                    "grad_relu_output": full, "grad_conv_output": full},
        "backward: conv weight gradient": {"input_uint8": uint8, "rescaled_input": rescaled,
                                           "grad_conv_output": full},
    }


def peak_moment(size: int = 200, precision: str = "float32") -> str:
    moments = activation_moments(size, precision)
    return max(moments, key=lambda m: sum(moments[m].values()))


def activation_bytes_per_image(size: int = 200, precision: str = "float32",
                               host_batches: int = 0) -> dict[str, int]:
    """What one more image adds to the peak of a training step, by tensor: the tensors live at
    the peak moment (`peak_moment`: ReLU's gradient, for this network: the uint8 input, the
    rescaled input, the ReLU output, and three full-resolution 32-channel maps' worth of those
    and of the gradients), plus `host_batches` extra uint8 input batches held in the same
    memory (the CPU input pipeline's; 0 on a GPU, whose memory holds only the step's batch)."""
    parts = dict(activation_moments(size, precision)[peak_moment(size, precision)])
    parts["host_input_batches"] = host_batches * 3 * size * size
    return parts


def predict_max_batch_size(cap_bytes: float, calibration_batch: int, calibration_peak_bytes: float,
                           size: int = 200, optimizer: str = "adam", precision: str = "float32",
                           host_batches: int = 0) -> dict:
    """The largest batch size whose predicted peak stays under `cap_bytes`, the baseline
    calibrated from one probe (`calibration_batch` images peaked at `calibration_peak_bytes`).

    Returns the breakdown too: per_image, state, baseline (bytes) and max_batch_size (0 when
    not even one image fits)."""
    per_image = sum(activation_bytes_per_image(size, precision, host_batches).values())
    state = sum(state_bytes(size, optimizer, precision).values())
    baseline = calibration_peak_bytes - state - per_image * calibration_batch
    room = cap_bytes - baseline - state
    return {"max_batch_size": max(0, int(room // per_image)), "per_image_bytes": per_image,
            "state_bytes": state, "baseline_bytes": baseline, "cap_bytes": cap_bytes}


# --- memory: a compiler's plan (Keras on JAX) -----------------------------------------------------
# XLA fuses ops and assigns buffers itself, so on JAX the tensors live at the peak are the
# compiler's choice, and the analytic model above does not speak for it (on a CPU at 40 px XLA's
# step held three times the analytic per-image bytes). XLA states its plan instead: the bytes its
# buffer assignment gives a step of a given batch size (backends.jax.compiled_step_bytes). The
# prediction is then  baseline + plan(batch) <= cap,  the baseline calibrated as above.


def predict_max_batch_size_planned(plan, cap_bytes: float, calibration_batch: int,
                                   calibration_peak_bytes: float, second_batch: int = 64,
                                   refinements: int = 3) -> dict:
    """The largest batch size whose planned peak stays under `cap_bytes`; `plan(batch)` gives the
    compiled step's bytes. A line through the plans at the calibration batch and `second_batch`
    gives a first answer, then secant steps on the plan itself (up to `refinements` more
    compilations) until the answer is within one image of the cap."""
    planned: dict[int, int] = {}

    def at(b: int) -> int:
        if b not in planned:
            planned[b] = int(plan(b))
        return planned[b]

    baseline = calibration_peak_bytes - at(calibration_batch)
    room = cap_bytes - baseline  # what the step itself may take
    a, b = calibration_batch, max(second_batch, calibration_batch + 1)
    for _ in range(refinements + 1):
        slope = (at(b) - at(a)) / (b - a) or 1.0
        guess = max(1, int(b + (room - at(b)) // slope))
        if guess in (a, b) or abs(at(guess) - room) < slope:
            b = guess
            break
        a, b = b, guess
    slope = (at(b) - at(calibration_batch)) / max(1, b - calibration_batch) or 1.0
    best = b
    if at(best) > room:  # over by a little: step down at the local slope
        best = max(0, best - int(-(-(at(best) - room) // slope)))
    if at(calibration_batch) > room:
        best = 0
    return {"max_batch_size": best, "per_image_bytes": slope, "method": "xla",
            "planned_bytes": dict(sorted(planned.items())),
            "state_bytes": at(calibration_batch) - slope * calibration_batch,
            "baseline_bytes": baseline, "cap_bytes": cap_bytes}
