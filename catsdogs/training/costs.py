"""What the article's model costs: parameters, FLOPs and memory, in closed form.

Arithmetic only, no framework: the command's own process predicts with it (find-batch-size's
analytic memory model) and stays free of TensorFlow's start-up lines and its memory.
"""

from __future__ import annotations

import itertools

from catsdogs.optimizers import OPTIMIZERS


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


# --- memory under TensorFlow: the step's allocations, replayed through BFC ------------------------
# What a TensorFlow worker's memory holds is decided by its allocator, TensorFlow's BFC (the CPU
# workers use it too: backends.tensorflow). Its log (TF_CPP_VMODULE=bfc_allocator=4) shows, for
# the article's model on this CPU (TensorFlow 2.21, oneDNN), float32, at 40 and 64 px:
# - the step allocates, in this order: the rescaled input (the uint8 batch then goes); one
#   full-resolution 32-channel map (oneDNN fuses the convolution with its ReLU); the pooled map
#   and max-pooling's workspace (one byte per pooled value); the Dense kernel's gradient and a
#   temporary of its size; the gradient reaching the pooled map; max-pooling's gradient, a second
#   full map (the ReLU's gradient is applied in place). Then everything of the step goes, in
#   the order below. Before the first step: the weights and the optimizer's slots, the training
#   images as one constant, and the input pipeline's batches (the step's, and two prefetched).
# - BFC takes memory from the system in regions, 2 MiB first, each new region twice the last
#   (or the next power of two that holds the request), and never gives one back; it puts a
#   tensor in the smallest free chunk that holds it (never across regions), splitting it when
#   the rest is worth keeping.
# - A worker's peak resident memory is then its runtime (everything outside BFC, measured by
#   the batch-size-1 probe) plus the pages of BFC's regions that a tensor has ever written:
#   with the allocator's own addresses at batch 1,104 (40 px), 850 MiB written, against 841
#   MiB of resident memory above the runtime, while only 597 MiB were ever in use at once.
#   Those touched, never-returned pages are why a prediction from the live tensors alone was
#   up to 20% short at batch sizes where a map no longer fits the regions there are.
# So the prediction replays the step's allocations at a batch size through a model of BFC and
# counts the pages written: `bfc_replay`. Nothing is fitted; the runtime comes from one probe.

# float32 tensors of the weights' shape: Adam's m and v (catsdogs.optimizers)
OPTIMIZER_SLOTS = {name: o.slots for name, o in OPTIMIZERS.items()}
PREFETCHED_BATCHES = 2  # input batches the pipeline holds besides the step's (backends.*.train_batches)
PROBE_STEPS = 3  # a probe's warm-up step and two timed ones, as find-batch-size runs them
BFC_MIN_BYTES = 256  # BFC rounds every request up to a multiple of this
BFC_FIRST_REGION = 2 * 2**20  # with growth on (the CPU's BFC, and a GPU with memory growth)
BFC_MAX_INTERNAL_FRAGMENTATION = 128 * 2**20  # a chunk this much larger than the request is split


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


def tensor_bytes(batch: int, size: int, precision: str = "float32") -> dict[str, int]:
    """The bytes of each tensor of a training step at this batch size (see above)."""
    a = _activation_bytes(precision)
    px, pooled = size * size, (size // 2) * (size // 2)
    return {"input_uint8": batch * 3 * px, "rescaled_input": batch * 3 * px * a,
            "full_map": batch * 32 * px * a, "pooled_map": batch * 32 * pooled * a,
            "pool_workspace": batch * 32 * pooled, "dense_kernel": 4 * 32 * pooled * 128,
            "dense_output": batch * 128 * a}


def step_allocations(batch: int, size: int, optimizer: str = "adam", precision: str = "float32",
                     train_images: int = 1200, steps: int = PROBE_STEPS) -> list[tuple[str, int]]:
    """A probe's allocations and frees, in order, as BFC's log shows them: (name, bytes) to
    allocate, (name, 0) to free. Tensors smaller than the Dense layer's output are left out."""
    t = tensor_bytes(batch, size, precision)
    ev: list[tuple[str, int]] = [("runtime", BFC_MIN_BYTES)]  # small tensors come first: the 2 MiB region
    slots = ["kernel"] + [f"slot{i}" for i in range(OPTIMIZER_SLOTS[optimizer])]
    ev += [(name, t["dense_kernel"]) for name in slots]
    images = train_images * 3 * size * size  # the training images, made a constant from a copy
    ev += [("train_images", images), ("images_copy", images), ("images_copy", 0)]
    if precision.startswith("mixed"):
        ev.append(("kernel_cast", t["dense_kernel"] // 2))
    batches = min(steps, 1 + PREFETCHED_BATCHES)
    ev += [(f"batch{i}", t["input_uint8"]) for i in range(batches)]
    for i in range(steps):
        if i + batches - 1 < steps and i:  # the pipeline gathers the next batch while this one runs
            ev.append((f"batch{i + batches - 1}", t["input_uint8"]))
        ev += [("rescaled", t["rescaled_input"]), (f"batch{i}", 0), ("relu", t["full_map"]),
               ("pooled", t["pooled_map"]), ("workspace", t["pool_workspace"]), ("dense", t["dense_output"]),
               ("grad_kernel", t["dense_kernel"]), ("kernel_temp", t["dense_kernel"]),
               ("grad_pooled", t["pooled_map"]), ("grad_relu", t["full_map"]), ("kernel_temp", 0),
               ("grad_kernel", 0), ("dense", 0), ("pooled", 0), ("grad_pooled", 0),
               ("workspace", 0), ("relu", 0), ("rescaled", 0), ("grad_relu", 0)]
    return ev


def bfc_replay(events: list[tuple[str, int]], region_bytes: int | None = None) -> dict:
    """Replay allocations through a model of BFC (TensorFlow's bfc_allocator.cc): best fit over
    size-binned free chunks (smallest size, then lowest address), chunks split when the rest is
    at least the request or 128 MiB, neighbours merged when freed, regions never returned.
    `region_bytes`: one region of that size and no growth (a GPU capped as a logical device);
    None: regions grow from 2 MiB, doubling. Returns the bytes of pages ever written
    ("touched"), the peak in use, the regions, and whether every allocation found room."""
    regions: list[int] = []
    chunks: list[list] = []  # [region, offset, size, name or None], per region in address order
    touched: list[list[tuple[int, int]]] = []  # written intervals, per region
    live: dict[str, list] = {}
    state = {"next": BFC_FIRST_REGION if region_bytes is None else region_bytes, "in_use": 0, "peak": 0}

    def extend(rounded: int) -> bool:
        if region_bytes is not None and regions:
            return False
        grown = False
        while rounded > state["next"]:
            state["next"] *= 2
            grown = True
        regions.append(state["next"])
        touched.append([])
        chunks.append([len(regions) - 1, 0, state["next"], None])
        if not grown and region_bytes is None:
            state["next"] *= 2
        return True

    def find(rounded: int):
        free = [c for c in chunks if c[3] is None and c[2] >= rounded]
        # BFC's bins order by size and then address; a later region sits lower (mmap grows down)
        return min(free, key=lambda c: (c[2].bit_length(), c[2], -c[0], c[1]), default=None)

    ok = True
    for name, nbytes in events:
        if nbytes == 0:  # free, merging with free neighbours in the same region
            chunk = live.pop(name)
            chunk[3] = None
            state["in_use"] -= chunk[2]
            i = chunks.index(chunk)
            if i + 1 < len(chunks) and chunks[i + 1][3] is None and chunks[i + 1][0] == chunk[0]:
                chunk[2] += chunks.pop(i + 1)[2]
            if i > 0 and chunks[i - 1][3] is None and chunks[i - 1][0] == chunk[0]:
                chunks[i - 1][2] += chunks.pop(i)[2]
            continue
        rounded = -(-nbytes // BFC_MIN_BYTES) * BFC_MIN_BYTES
        chunk = find(rounded)
        if chunk is None:
            if not extend(rounded) or (chunk := find(rounded)) is None:
                ok = False
                break
        rest = chunk[2] - rounded
        if chunk[2] >= 2 * rounded or rest >= BFC_MAX_INTERNAL_FRAGMENTATION:
            chunk[2] = rounded
            chunks.insert(chunks.index(chunk) + 1, [chunk[0], chunk[1] + rounded, rest, None])
        chunk[3] = name
        live[name] = chunk
        state["in_use"] += chunk[2]
        state["peak"] = max(state["peak"], state["in_use"])
        _mark(touched[chunk[0]], chunk[1], chunk[1] + nbytes)
    return {"touched_bytes": sum(b - a for spans in touched for a, b in spans), "peak_in_use_bytes": state["peak"],
            "regions": regions, "fits": ok}


def _mark(spans: list[tuple[int, int]], start: int, end: int) -> None:
    """Add [start, end) to a sorted list of disjoint intervals, in place."""
    merged = [(start, end)]
    for a, b in spans:
        if b < merged[0][0] or a > merged[0][1]:
            merged.append((a, b))
        else:
            merged[0] = (min(a, merged[0][0]), max(b, merged[0][1]))
    spans[:] = sorted(merged)


def predict_max_batch_size(cap_bytes: float, calibration_batch: int, calibration_peak_bytes: float,
                           size: int = 200, optimizer: str = "adam", precision: str = "float32",
                           train_images: int = 1200, device: str = "cpu", steps: int = PROBE_STEPS,
                           kernel_bytes_per_image: float = 0.0) -> dict:
    """The largest batch size whose replayed peak stays under `cap_bytes`.

    On the CPU (`device` "cpu", the peak resident memory): runtime + the pages BFC's growing
    regions have had written, the runtime calibrated by one probe (`calibration_batch` images
    peaked at `calibration_peak_bytes`), + `kernel_bytes_per_image` for each image past it (what
    this CPU's kernels hold beyond the replay, where a second probe measured it:
    memory_prediction.check_replay). On a GPU capped as a logical device, BFC has one region
    of the device's memory less the runtime's, and a batch size fits when every allocation
    finds room in it. Returns the breakdown too: per_image (the replay's slope from the calibration to
    the answer), state, baseline (the runtime) and max_batch_size (0: not even one image)."""
    def replay(b: int, region=None) -> dict:
        return bfc_replay(step_allocations(b, size, optimizer, precision, train_images, steps), region)

    calib = replay(calibration_batch)
    if device == "cpu":
        baseline = calibration_peak_bytes - calib["touched_bytes"]

        def fits(b: int) -> bool:
            return baseline + replay(b)["touched_bytes"] + kernel_bytes_per_image * (b - calibration_batch) <= cap_bytes
    else:  # the allocator's own peak, which the calibration measured, less its live tensors
        baseline = calibration_peak_bytes - calib["peak_in_use_bytes"]
        region = int(cap_bytes - baseline)

        def fits(b: int) -> bool:
            return region > 0 and replay(b, region)["fits"]

    best = _largest(fits)
    at = replay(best)["touched_bytes"] if best else calib["touched_bytes"]
    slope = (at - calib["touched_bytes"]) / max(1, best - calibration_batch)
    return {"max_batch_size": best, "per_image_bytes": slope, "state_bytes": sum(state_bytes(size, optimizer,
            precision).values()), "baseline_bytes": baseline, "cap_bytes": cap_bytes, "method": "bfc",
            "kernel_bytes_per_image": kernel_bytes_per_image}


def predicted_peak_bytes(batch: int, baseline_bytes: float, size: int, optimizer: str = "adam",
                         precision: str = "float32", train_images: int = 1200, device: str = "cpu",
                         steps: int = PROBE_STEPS, kernel_bytes_per_image: float = 0.0,
                         calibration_batch: int = 1) -> float:
    """The peak at a batch size, by the replay: on the CPU the runtime + the pages written (+ the
    kernels' bytes past the calibration's images, as predict_max_batch_size counts them); on a
    GPU the runtime + the allocator's peak in use."""
    replay = bfc_replay(step_allocations(batch, size, optimizer, precision, train_images, steps))
    if device != "cpu":
        return baseline_bytes + replay["peak_in_use_bytes"]
    return baseline_bytes + replay["touched_bytes"] + kernel_bytes_per_image * (batch - calibration_batch)


def _largest(fits, limit: int = 2**20) -> int:
    """The largest b in [1, limit] with fits(b), by doubling then bisection (0: none)."""
    if not fits(1):
        return 0
    lo = 1
    while lo < limit and fits(min(limit, lo * 2)):
        lo = min(limit, lo * 2)
    hi = min(limit, lo * 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


# --- memory: a compiler's plan (Keras on JAX) -----------------------------------------------------
# XLA fuses ops and assigns buffers itself, so on JAX the tensors live at the peak are the
# compiler's choice, and TensorFlow's allocations above do not speak for it (on a CPU at 40 px
# XLA's step held three times their per-image bytes). XLA states its plan instead: the bytes its
# buffer assignment gives a step of a given batch size (backends.jax.compiled_step_bytes). The
# prediction is then  baseline + plan(batch) <= cap,  the baseline calibrated as above.


# The plan is compiled at a few small batch sizes only, never near the limit: on the H200 each
# compilation near 4,800 took about 48 s (its autotuning runs the step's convolutions at that size),
# and the memory model's part of the answer was 109 s of 178. XLA's plan is close to a line in the
# batch size (on this CPU the line through 64 and 256 lands within 4% of the measured limit at
# 64 px: docs/performance.md), so the line through the largest two sizes compiled carries it to
# the cap. No size above the search's own bound (the training split) is compiled either.
PLAN_SECOND = 64  # the plan's second batch size, after the calibration's
PLAN_MOST = 256  # ... and its largest: a few hundred, whatever the limit


def plan_batch_sizes(calibration_batch: int, bound: int | None = None) -> list[int]:
    """The batch sizes XLA's plan is compiled at: the calibration's, PLAN_SECOND and PLAN_MOST,
    none above `bound` (the search's upper bound)."""
    most = min(PLAN_MOST, bound) if bound else PLAN_MOST
    return sorted({calibration_batch, min(PLAN_SECOND, most), most})


def predict_max_batch_size_planned(planned: dict[int, float], cap_bytes: float, calibration_batch: int,
                                   calibration_peak_bytes: float) -> dict | None:
    """The largest batch size whose planned peak stays under `cap_bytes`, from the plan's bytes at
    a few batch sizes (`planned`, the calibration's among them): the runtime baseline is the
    calibration probe's peak less its plan; between the sizes compiled the plan is read on a line
    between them, past the largest on the line through the largest two. None with fewer than two
    sizes, or no slope to extrapolate."""
    sizes = sorted(int(b) for b in planned)
    if len(sizes) < 2 or calibration_batch not in sizes:
        return None
    at = {b: float(planned[b]) for b in sizes}
    baseline = calibration_peak_bytes - at[calibration_batch]
    room = cap_bytes - baseline  # what the step itself may take
    segments = list(itertools.pairwise(sizes))
    lo, hi = next(((a, b) for a, b in segments if at[b] > room), segments[-1])
    slope = (at[hi] - at[lo]) / (hi - lo)
    if slope <= 0:
        return None
    best = 0 if at[calibration_batch] > room else max(0, lo + int((room - at[lo]) // slope))
    return {"max_batch_size": best, "per_image_bytes": slope, "method": "xla",
            "planned_bytes": {b: int(at[b]) for b in sizes}, "state_bytes": at[hi] - slope * hi,
            "baseline_bytes": baseline, "cap_bytes": cap_bytes}


# --- memory for any model: a line through two probes ------------------------------------------
# Neither the BFC replay (the article's layers) nor XLA's plan (on this CPU 36-69% high for a small
# ResNet and a MobileNet: docs/results.md) holds another model to 15%. What does: a fresh worker's
# peak resident memory is close to a line in the batch size, from batch 1 up to the limit (a small
# ResNet's at 1, 16, ..., 768 and MobileNet's at 1, 32, ..., 1536 on both backends, each in a
# fresh worker: docs/performance.md). So two probes give it: the calibration at batch 1, and one
# fresh probe far enough from it that the peak's run-to-run noise (tens of MiB) is small against
# what the batch adds, and at most a quarter of the answer, so that the answer is not fitted to a
# probe near the limit. The second probe's size comes from the model's activations (the sum of
# its layers' outputs, an image's, which put the first two models' slopes within 0.7x to 1.5x).

LINE_SHARE = 5  # the second probe: this fraction (1/5) of what the activations alone would fit


def line_second_batch(cap_bytes: float, calibration_peak_bytes: float, activation_bytes_per_image: float) -> int:
    """The second probe's batch size: a fifth of the images whose activations would fill the room
    the calibration leaves under the cap, a multiple of 8 (at least 8)."""
    room = cap_bytes - calibration_peak_bytes
    if room <= 0 or activation_bytes_per_image <= 0:
        return 8
    return max(8, int(room / activation_bytes_per_image / LINE_SHARE) // 8 * 8)


def predict_max_batch_size_line(cap_bytes: float, calibration_batch: int, calibration_peak_bytes: float,
                                second_batch: int, second_peak_bytes: float) -> dict | None:
    """The largest batch size under `cap_bytes` on the line through the two probes' peaks; None
    when the second peak is not above the first (no slope to extrapolate)."""
    slope = (second_peak_bytes - calibration_peak_bytes) / (second_batch - calibration_batch)
    if slope <= 0:
        return None
    baseline = calibration_peak_bytes - slope * calibration_batch
    best = max(0, int((cap_bytes - baseline) // slope))
    return {"max_batch_size": best, "per_image_bytes": slope, "method": "line", "state_bytes": 0.0,
            "baseline_bytes": baseline, "cap_bytes": cap_bytes, "second_batch_size": second_batch,
            "second_peak_mb": second_peak_bytes / 2**20}
