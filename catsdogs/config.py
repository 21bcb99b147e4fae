"""The defaults of the data and of a study, each with why it is what it is (docs/protocol.md is the
specification). A trial's own fields (optimizer, batch size, protocol options) and their defaults
and allowed values are in catsdogs.schema; the engine's (how many compiled steps a worker keeps)
in catsdogs.training.engine; a probe's (steps, warm-up) in catsdogs.measure.profile and
catsdogs.measure.find_batch_size."""

import os
from pathlib import Path

# --- the source archive -------------------------------------------------------------------
# Microsoft's PetImages archive, as the article used it.
ARCHIVE_URL = (
    "https://download.microsoft.com/download/3/E/1/"
    "3E1C3F21-ECDB-4869-8368-6DEBA77B919F/kagglecatsanddogs_5340.zip"
)
ARCHIVE_SIZE = 824_887_076  # bytes, as published
ARCHIVE_SHA256 = "b7974bd00a84a99921f36ee4403f089853777b5ae8d151c76a86e64900334af9"
CLASSES = ("Cat", "Dog")  # label = index: alphabetical, as flow_from_directory assigns them

# --- prepare -------------------------------------------------------------------------------
DATA_DIR_ENV = "CATSDOGS_DATA_DIR"
DEFAULT_DATA_DIR = "data"
PER_CLASS = 1000  # the article's files_per_class
SPLIT = (600, 200, 200)  # train / validation / test, per class
SPLIT_NAMES = ("train", "validation", "test")
IMAGE_SIZE = 200  # load_img(target_size=(200, 200))
AUGMENT_SCALE = 1.25  # the article resizes 200 -> 250 and crops the top-left 200 x 200
JPEG_QUALITY = 75  # Pillow's default, which save_img used
SEED = 0
# A decoded image larger than this is refused as a decompression bomb. The biggest real
# PetImages photo is a few megapixels; Pillow's own warning threshold is ~89 MP.
MAX_IMAGE_PIXELS = 64_000_000

# --- sweep ---------------------------------------------------------------------------------
BATCH_SIZES = (16, 32, 64, 128)  # the article's first figure
EPOCHS = 5
SEEDS = 3  # the article ran each point once; three seeds show the spread
# Adaptive seeds (sweep --target-ci W): a cell with a wider interval than ±W points gets more
# seeds, up to this many. Bimodal cells (some seeds collapse) need ~40 for ±5 points: 20 caps the
# cost of one cell at 7x a 3-seed cell and still halves a 3-seed interval's width several times.
MAX_SEEDS = 20
# The gradient noise scale (catsdogs.gradient_noise; `sweep --noise-scale`, find-batch-size). A measurement
# is NOISE_PAIRS large batches, each NOISE_MICROS micro-batches of NOISE_MICRO images drawn with
# replacement: 80 images' per-example gradients. Sized so that measuring at a trial's start and
# after each of its epochs costs at most 15% of its training at 64 px (benchmarks/bench_noise.py);
# the report pools a cell's seeds, find-batch-size measures more pairs once.
NOISE_MICRO = 1  # B_s: each example its own micro-batch (the Gram matrix gives any B_s for free)
NOISE_MICROS = 10  # micro-batches per large batch: B_b = 10
NOISE_PAIRS = 8  # the fewest that give Fieller's interval a usable t (2.36 on 7 df)
DEFAULT_OUT = "outputs"
STORE_FILE = "results.sqlite"  # under --out, shared by every sweep


def default_data_dir() -> Path:
    return Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR)
# The validation curve (sweep --eval-every N): every evaluation at this batch size, whatever the
# training batch, so no batch size is evaluated with other arithmetic or at another cost per image.
EVAL_BATCH_SIZE = 100
