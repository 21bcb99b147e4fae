"""Dot products of per-example gradients, without forming the gradients ("ghost norms").

The gradient noise scale (catsdogs.gradient_noise) needs squared norms of the mean gradient over small
and large batches at the same weights. Forming each micro-batch's gradient costs a full
parameter-sized write (the Dense(128) kernel alone is 4.2M numbers at 64 px, 41M at 200 px) for
a few images' worth of arithmetic. For layers that are affine maps followed by an activation,
the per-example gradient's dot products come from quantities one forward and backward pass at
the large batch gives anyway: with a_i the layer's input for example i and d_i the gradient of
example i's loss with respect to the layer's pre-activation,

    Dense:   g_i . g_j = (a_i . a_j + 1) (d_i . d_j)           (kernel, then bias)
    Conv2D:  g_i = (sum_p patch_ip (x) d_ip, sum_p d_ip)       (formed: 27 x 32 + 32 numbers)

so the per-example **gradient Gram matrix** K_ij = g_i . g_j of a batch costs about one training
step, and any batch's mean gradient has |G_S|^2 = (1/|S|^2) sum_{i,j in S} K_ij.

The model is the sweep's own (catsdogs.training.model), run by its own layers: weightless layers
(Rescaling, MaxPooling2D, Flatten) are called as they are; Dense and Conv2D compute their
pre-activation with the layer's own kernel, bias and `convolution_op`, as their `call` does, then
their own activation. The loss is catsdogs.training.model's, binary cross-entropy from the logit, per
example. A zero perturbation added to each pre-activation is what the backend differentiates
with respect to (`taps`): its gradient is d_i. Pure keras.ops, so both backends share it; each
wraps it with its own autodiff and compiler (backends.*.per_example_gram). Nothing is assigned:
the trial's weights, optimizer and metrics are untouched.

The Dense and Conv2D layers compute in float32 here whatever the model's precision policy: the
gradient of a single example's loss, in float16 without the trainer's loss scaling, would
underflow. The weightless layers run as the model runs them.
"""

from __future__ import annotations

from keras import layers, ops

WEIGHTLESS = (layers.Rescaling, layers.MaxPooling2D, layers.Flatten, layers.InputLayer)


REGULARIZERS = ("kernel_regularizer", "bias_regularizer", "activity_regularizer")


def tapped_layers(model) -> list:
    """The model's Dense and Conv2D layers, in order; an error for any layer with weights that
    is neither (its gradient would be missed), and for a regularized one: a regularizer adds a
    term to the loss whose gradient the dot products above do not have (a weight penalty's is the
    same for every example, an activity penalty's is not), so the noise scale would silently
    leave it out."""
    tapped = []
    for layer in model.layers:
        if isinstance(layer, (layers.Dense, layers.Conv2D)):
            if isinstance(layer, layers.Conv2D) and layer.data_format != "channels_last":
                raise ValueError(f"per-example gradients: {layer.name} is not channels_last")
            regularized = [r for r in REGULARIZERS if getattr(layer, r, None) is not None]
            if regularized:
                raise ValueError(f"per-example gradients: layer {layer.name} has a {' and a '.join(regularized)}, "
                                 "whose loss term these dot products leave out")
            tapped.append(layer)
        elif layer.weights or not isinstance(layer, WEIGHTLESS):
            raise ValueError(f"per-example gradients: layer {layer.name} ({type(layer).__name__}) is not supported")
    return tapped


def tap_shapes(model, batch: int) -> list[tuple]:
    """The shapes of the perturbations: each tapped layer's pre-activation at this batch size."""
    return [(batch, *layer.output.shape[1:]) for layer in tapped_layers(model)]


def forward(model, images, labels, taps: list):
    """(the sum of the per-example losses, each tapped layer's input), with taps[k] added to the
    k-th tapped layer's pre-activation (zeros: the model's own output)."""
    inputs, k, h = [], 0, images
    for layer in model.layers:
        if not isinstance(layer, (layers.Dense, layers.Conv2D)):
            h = layer(h)
            continue
        a = ops.cast(h, "float32")  # float32 whatever the policy: see the module's note
        kernel = ops.cast(layer.kernel, "float32")
        if isinstance(layer, layers.Dense):
            z = ops.matmul(a, kernel)
            if layer.bias is not None:
                z = ops.add(z, ops.cast(layer.bias, "float32"))
        else:
            z = layer.convolution_op(a, kernel)
            if layer.use_bias:
                z = ops.add(z, ops.reshape(ops.cast(layer.bias, "float32"), (1, 1, 1, layer.filters)))
        z = ops.add(z, ops.cast(taps[k], z.dtype))
        inputs.append(a)
        k += 1
        h = layer.activation(z) if layer.activation is not None else z
    logits = ops.cast(ops.reshape(h, (-1,)), "float32")
    losses = ops.binary_crossentropy(ops.cast(labels, "float32"), logits, from_logits=True)
    return ops.sum(losses), inputs


def _patches(a, layer):
    """(batch, positions, kh * kw * channels): the input window under each output position of a
    Conv2D, gathered by slicing (any consistent order of the window's numbers will do)."""
    kh, kw = layer.kernel_size
    sh, sw = layer.strides
    dh, dw = layer.dilation_rate
    _, height, width, _ = a.shape
    if layer.padding == "same":
        out_h, out_w = -(-height // sh), -(-width // sw)
        pad_h = max((out_h - 1) * sh + (kh - 1) * dh + 1 - height, 0)
        pad_w = max((out_w - 1) * sw + (kw - 1) * dw + 1 - width, 0)
        a = ops.pad(a, ((0, 0), (pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    else:
        out_h, out_w = (height - (kh - 1) * dh - 1) // sh + 1, (width - (kw - 1) * dw - 1) // sw + 1
    windows = [a[:, i * dh: i * dh + (out_h - 1) * sh + 1: sh, j * dw: j * dw + (out_w - 1) * sw + 1: sw, :]
               for i in range(kh) for j in range(kw)]
    stacked = ops.stack(windows, axis=3)  # (batch, out_h, out_w, kh * kw, channels)
    return ops.reshape(stacked, (stacked.shape[0], out_h * out_w, -1))


def gram_blocks(tapped: list, inputs: list, deltas: list, block: int):
    """The per-example gradient Gram matrix within each block of `block` consecutive examples:
    (batch // block, block, block), float32."""
    total = None
    for layer, a, d in zip(tapped, inputs, deltas, strict=True):
        a, d = ops.cast(a, "float32"), ops.cast(d, "float32")
        n = d.shape[0]
        if isinstance(layer, layers.Dense):
            a = ops.reshape(a, (n // block, block, -1))
            d = ops.reshape(d, (n // block, block, -1))
            part = (_block_gram(a) + (1.0 if layer.bias is not None else 0.0)) * _block_gram(d)
        else:
            p = _patches(a, layer)  # (n, positions, window)
            d = ops.reshape(d, (n, p.shape[1], -1))  # (n, positions, filters)
            kernel = ops.reshape(ops.einsum("npk,npf->nkf", p, d), (n // block, block, -1))
            part = _block_gram(kernel)
            if layer.use_bias:
                part = part + _block_gram(ops.reshape(ops.sum(d, axis=1), (n // block, block, -1)))
        total = part if total is None else total + part
    return total


def _block_gram(x):
    return ops.matmul(x, ops.transpose(x, (0, 2, 1)))
