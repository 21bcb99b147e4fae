"""A synthetic stand-in for Microsoft's PetImages archive, for machines that cannot download it.

`make_synthetic_archive` writes a zip laid out like the real one (docs/protocol.md, "Data"): ::

    PetImages/Cat/0.jpg ... PetImages/Cat/<n_valid + 3>.jpg, PetImages/Cat/Thumbs.db
    PetImages/Dog/0.jpg ... PetImages/Dog/<n_valid + 3>.jpg, PetImages/Dog/Thumbs.db
    CDLA-Permissive-2.0.pdf, readme[1].txt              (placeholder texts)

so that it goes through the very same code path as the real archive (extract, validate,
select and split, resize). Per class there are `n_valid` images that decode, four of them odd
but valid like some real photos (a grayscale JPEG, a CMYK JPEG, a palette PNG and an RGBA PNG,
both PNGs under a ``.jpg`` name), and four bad files numbered in the same sequence: a 0-byte
file, a JPEG cut to half its bytes (``verify()`` passes it, ``load()`` does not), a text file
that is not an image, and a decompression bomb (a small JPEG whose frame header claims
40000 x 40000 pixels). Their indices are drawn with the seed, one in each eighth of the
sequence, never adjacent once ``n_valid >= 12``. The bytes are a pure function of
``(n_valid, seed)`` on a given Pillow/libjpeg build: fixed member order, fixed timestamps and
attributes, and every member stored uncompressed.

The class signal: why it is learnable, but not trivially
-------------------------------------------------------
Every image is a photo-like scene: a smooth two-colour gradient background at a random angle,
a few soft blobs of random colour (clutter), a little pixel noise, and one "animal": a
soft-edged ellipse at a random position, scale (semi-major axis 25-45 % of the shorter side)
and rotation, filled with a striped "fur" texture whose stripe period follows the animal's
size. Width and height are drawn independently (100-500 px), so the nearest-neighbour resize
to a square squashes every scene differently, as it does real photos.

Only two properties of the animal depend on the class, and each is drawn from two
*overlapping* distributions (`ClassSignal`):

* fur hue: cats centre on orange (0.05 of the colour circle), dogs on yellow (0.15), each
  with a Gaussian spread of 0.045, so some cats are as yellow as a typical dog and vice versa
  (hue alone: an ideal observer gets about 87 % right);
* stripe orientation: cats centre on horizontal stripes, dogs on vertical ones, each with a
  Gaussian spread of 30 degrees, so many stripes are diagonal and ambiguous (about 85 %).

Everything else (background colours, clutter of any hue, position, scale, rotation of the
outline, stripe phase, saturation, brightness, image size) is class-independent nuisance, and
no label is flipped. An ideal observer reading both cues exactly would get about 94 % right;
the article's model gets much less in five epochs. Its one 3x3 convolution and max-pool feed
a dense layer that holds a separate weight for every position, so it has to learn the colour
cue at every place an animal may sit, through clutter of similar colours, and the
orientation cue needs its filters to turn into oriented edge detectors; a few hundred updates
get part of the way, fewer updates (large batches, plain SGD) get less. Measured with
``studies/calibrate_synthetic.py`` (1,000 images per class, split 600/200/200, 5 epochs,
training seed 0, 2-core CPU): at 200 px, Adam reaches 82.5 % at batch size 32 and 67 % at
256, SGD 63 % at batch size 32 and 53 % at 256; at 64 px with 100 training images per class,
Adam at batch size 16 reaches 63-79 % (mean 74 % over five seeds). With an earlier, weaker
setting some runs collapsed to a constant prediction (50 %); that can still happen with an
unlucky seed.
"""

from __future__ import annotations

import colorsys
import io
import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from catsdogs.files import temporary_sibling

CLASS_NAMES = ("Cat", "Dog")  # the same folder names as config.CLASSES

# What the returned dict says about each special member.
BAD_KINDS = ("empty", "truncated", "not-image", "bomb")  # fail to decode
ODD_KINDS = ("grayscale", "cmyk", "palette-png", "rgba-png")  # decode: count as valid
EXTRA_KINDS = ("thumbs-db", "license-pdf", "readme")  # non-.jpg members
SYNTHETIC_KINDS = BAD_KINDS + ODD_KINDS + EXTRA_KINDS
# The Pillow mode each odd kind decodes to.
ODD_MODES = {"grayscale": "L", "cmyk": "CMYK", "palette-png": "P", "rgba-png": "RGBA"}

N_SPECIAL = len(BAD_KINDS) + len(ODD_KINDS)  # special .jpg names per class
N_BAD = len(BAD_KINDS)  # .jpg names per class beyond n_valid
MIN_SIDE, MAX_SIDE = 100, 500  # image width and height, drawn independently
JPEG_QUALITY = 88
BOMB_SIDE = 40_000  # 1.6 gigapixels: far past Pillow's and catsdogs' limits
ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip can hold: fixed bytes
LICENSE_NAME = "CDLA-Permissive-2.0.pdf"
README_NAME = "readme[1].txt"

_PLACEHOLDER = (
    "This is a synthetic stand-in generated by catsdogs (catsdogs.synthetic), not Microsoft's "
    "PetImages archive. {what}\nIt holds generated pictures of ellipses with striped texture, "
    "not photos of cats and dogs; use it to test the pipeline, not to draw conclusions about "
    "real images.\n"
)
_LICENSE_TEXT = _PLACEHOLDER.format(
    what="The real archive ships the Community Data License Agreement - Permissive - "
    "Version 2.0 in this file; this placeholder is plain text, not a PDF."
)
_README_TEXT = _PLACEHOLDER.format(
    what="The real archive's readme describes the Asirra data set; this one only says that "
    "the files beside it are synthetic."
)
_NOT_IMAGE = (
    b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n"
    b"<body><h1>Not Found</h1><p>The requested picture was removed. "
    b"(synthetic stand-in generated by catsdogs)</p></body></html>\n"
)


@dataclass(frozen=True)
class ClassSignal:
    """How the class shows in an image: two overlapping distributions per cue (see above).

    Hues are fractions of the colour circle (0 = red, 1/6 = yellow); angles are in degrees,
    0 = horizontal stripes.
    """

    hue_mean: tuple[float, float] = (0.05, 0.15)  # (cat, dog): orange vs yellow-olive
    hue_sd: float = 0.045
    angle_mean: tuple[float, float] = (0.0, 90.0)  # (cat, dog): horizontal vs vertical
    angle_sd: float = 30.0
    clutter: tuple[int, int] = (2, 5)  # soft background blobs, low and high (inclusive)
    scale: tuple[float, float] = (0.25, 0.45)  # animal semi-major axis / shorter image side


DEFAULT_SIGNAL = ClassSignal()


def make_synthetic_archive(
    path: Path, n_valid: int, *, seed: int = 0, signal: ClassSignal = DEFAULT_SIGNAL
) -> dict[str, str]:
    """Write a PetImages-like zip to `path`; return {member name: kind} for the special members.

    `n_valid` images per class decode (four of them odd but valid), plus four bad ones, so
    each class folder holds ``n_valid + 4`` ``.jpg`` names, 0 upward. The returned dict names
    every odd, bad and non-``.jpg`` member with one of `SYNTHETIC_KINDS`; every ``.jpg`` it
    does not name is an ordinary RGB JPEG. The zip is written to a temporary name beside
    `path` and renamed into place, so `path` is either absent or complete. `signal` changes
    the class cues (for calibration); the default is what the project uses.
    """
    if n_valid < len(ODD_KINDS):
        raise ValueError(f"n_valid must be at least {len(ODD_KINDS)}, got {n_valid}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kinds: dict[str, str] = {}
    members: list[tuple[str, bytes]] = []
    noise = _noise_tile(np.random.default_rng([seed, 99]))
    for label, cls in enumerate(CLASS_NAMES):
        specials = _special_indices(n_valid, np.random.default_rng([seed, label, 7]))
        for index in range(n_valid + N_BAD):
            name = f"PetImages/{cls}/{index}.jpg"
            rng = np.random.default_rng([seed, label, index])
            kind = specials.get(index)
            members.append((name, _member_bytes(kind, label, rng, noise, signal)))
            if kind is not None:
                kinds[name] = kind
        thumbs = f"PetImages/{cls}/Thumbs.db"
        members.append((thumbs, _thumbs_db(np.random.default_rng([seed, label, 5]))))
        kinds[thumbs] = "thumbs-db"
    members.append((LICENSE_NAME, _LICENSE_TEXT.encode()))
    members.append((README_NAME, _README_TEXT.encode()))
    kinds[LICENSE_NAME] = "license-pdf"
    kinds[README_NAME] = "readme"

    tmp = temporary_sibling(path)  # this process's own: two prepares at once never share it
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
            for directory in ("PetImages/", *(f"PetImages/{c}/" for c in CLASS_NAMES)):
                zf.writestr(_zip_info(directory, is_dir=True), b"")
            for name, data in members:
                zf.writestr(_zip_info(name), data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return kinds


# --- which names are special -------------------------------------------------------------


def _special_indices(n_valid: int, rng: np.random.Generator) -> dict[int, str]:
    """Spread the 8 special kinds over the names: one per equal segment, never adjacent."""
    total = n_valid + N_BAD
    order = [str(k) for k in rng.permutation(np.array(BAD_KINDS + ODD_KINDS))]
    seg = total // N_SPECIAL  # >= 1 because n_valid >= 4
    chosen: dict[int, str] = {}
    for i, kind in enumerate(order):
        start = i * seg
        # Leave the segment's last slot free, so picks in neighbouring segments never touch.
        span = seg - 1 if seg >= 2 else 1
        chosen[start + int(rng.integers(span))] = kind
    return chosen


# --- member contents ---------------------------------------------------------------------


def _member_bytes(
    kind: str | None,
    label: int,
    rng: np.random.Generator,
    noise: np.ndarray,
    signal: ClassSignal,
) -> bytes:
    if kind == "empty":
        return b""
    if kind == "not-image":
        return _NOT_IMAGE
    if kind == "bomb":
        return _bomb(_scene(label, rng, noise, signal, max_side=160))
    image = _scene(label, rng, noise, signal)
    if kind == "truncated":
        data = _jpeg(image)
        return data[: len(data) // 2]
    if kind == "grayscale":
        return _jpeg(image.convert("L"))
    if kind == "cmyk":
        return _jpeg(image.convert("CMYK"))
    if kind == "palette-png":
        return _png(image.quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=0))
    if kind == "rgba-png":
        rgba = image.convert("RGBA")
        alpha = np.full((image.height, image.width), 255, np.uint8)
        alpha[: image.height // 8] = 128  # a half-transparent band, so alpha matters
        rgba.putalpha(Image.fromarray(alpha, "L"))
        return _png(rgba)
    return _jpeg(image)


def _jpeg(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def _bomb(image: Image.Image) -> bytes:
    """A small valid baseline JPEG whose SOF0 header claims BOMB_SIDE x BOMB_SIDE pixels."""
    data = bytearray(_jpeg(image))
    pos = 2  # after SOI: walk the marker segments up to the frame header
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise AssertionError("malformed JPEG from Pillow")  # pragma: no cover
        marker = data[pos + 1]
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker == 0xC0:  # SOF0: length(2) precision(1) height(2) width(2)
            data[pos + 5 : pos + 7] = BOMB_SIDE.to_bytes(2, "big")
            data[pos + 7 : pos + 9] = BOMB_SIDE.to_bytes(2, "big")
            return bytes(data)
        pos += 2 + length
    raise AssertionError("no SOF0 marker in Pillow's JPEG")  # pragma: no cover


def _thumbs_db(rng: np.random.Generator) -> bytes:
    """A few hundred bytes that start like the OLE2 file Windows writes, then noise."""
    header = bytes.fromhex("d0cf11e0a1b11ae1")
    return header + rng.integers(0, 256, size=504, dtype=np.uint8).tobytes()


def _zip_info(name: str, *, is_dir: bool = False) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=ZIP_DATE_TIME)
    info.create_system = 3  # Unix, whatever the host: the same bytes everywhere
    info.external_attr = ((0o40755 if is_dir else 0o100644) << 16) | (0x10 if is_dir else 0)
    info.compress_type = zipfile.ZIP_STORED
    return info


# --- the scene -----------------------------------------------------------------------------


def _noise_tile(rng: np.random.Generator) -> np.ndarray:
    """Pixel noise shared by all images (each crops it at a random offset): cheap and varied."""
    return rng.normal(0.0, 7.0, size=(MAX_SIDE + 64, MAX_SIDE + 64, 3)).astype(np.float32)


def _rgb(h: float, s: float, v: float) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb(h % 1.0, s, v), np.float32) * 255.0


def _scene(
    label: int,
    rng: np.random.Generator,
    noise: np.ndarray,
    signal: ClassSignal,
    max_side: int = MAX_SIDE,
) -> Image.Image:
    """One RGB picture of the class `label` (0 = cat, 1 = dog): see the module docstring."""
    w = int(rng.integers(MIN_SIDE, max_side + 1))
    h = int(rng.integers(MIN_SIDE, max_side + 1))

    # Background: a gradient between two muted colours along a random direction, computed on
    # a coarse grid (it is smooth) together with the clutter blobs, then upscaled.
    gw, gh = max(w // 8, 4), max(h // 8, 4)
    yy, xx = np.mgrid[0:gh, 0:gw].astype(np.float32)
    xx /= gw - 1
    yy /= gh - 1
    phi = rng.uniform(0, 2 * math.pi)
    t = (xx - 0.5) * math.cos(phi) + (yy - 0.5) * math.sin(phi)
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    c0 = _rgb(rng.uniform(), rng.uniform(0.05, 0.5), rng.uniform(0.3, 0.95))
    c1 = _rgb(rng.uniform(), rng.uniform(0.05, 0.5), rng.uniform(0.3, 0.95))
    bg = c0 + t[..., None] * (c1 - c0)
    for _ in range(int(rng.integers(signal.clutter[0], signal.clutter[1] + 1))):
        cx, cy = rng.uniform(0, 1, 2)
        r = rng.uniform(0.08, 0.3)
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))[..., None]
        colour = _rgb(rng.uniform(), rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.95))
        bg += blob * (colour - bg) * rng.uniform(0.5, 0.9)
    coarse = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8), "RGB")
    img = np.asarray(coarse.resize((w, h), Image.BILINEAR), dtype=np.float32).copy()

    # The animal: a soft ellipse with striped fur; hue and stripe angle carry the class.
    short = min(w, h)
    a = short * rng.uniform(*signal.scale)  # semi-major axis
    b = a * rng.uniform(0.55, 0.9)  # semi-minor axis
    rot = rng.uniform(0, math.pi)
    cx = rng.uniform(a, w - a) if w > 2 * a else w / 2
    cy = rng.uniform(a, h - a) if h > 2 * a else h / 2
    x0, x1 = max(int(cx - a) - 2, 0), min(int(cx + a) + 3, w)
    y0, y1 = max(int(cy - a) - 2, 0), min(int(cy + a) + 3, h)
    oy, ox = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    dx, dy = ox - cx, oy - cy
    u = dx * math.cos(rot) + dy * math.sin(rot)
    v = -dx * math.sin(rot) + dy * math.cos(rot)
    rad = np.sqrt((u / a) ** 2 + (v / b) ** 2)
    mask = np.clip((1.0 - rad) * a / 2.0, 0.0, 1.0)[..., None]  # ~2 px soft edge

    hue = rng.normal(signal.hue_mean[label], signal.hue_sd)
    angle = math.radians(rng.normal(signal.angle_mean[label], signal.angle_sd))
    period = a * rng.uniform(0.35, 0.6)  # 3-6 stripes across the animal
    # Stripes run along `angle`: the phase varies across them, i.e. along the normal.
    across = -dx * math.sin(angle) + dy * math.cos(angle)
    stripes = 0.5 + 0.5 * np.sin(2 * math.pi * across / period + rng.uniform(0, 2 * math.pi))
    sat, val = rng.uniform(0.45, 0.9), rng.uniform(0.55, 0.95)
    light = _rgb(hue, sat, val)
    dark = _rgb(hue, min(sat + 0.1, 1.0), val * 0.45)
    fur = dark + stripes[..., None] * (light - dark)
    patch = img[y0:y1, x0:x1]
    img[y0:y1, x0:x1] = patch + mask * (fur - patch)

    ny, nx = rng.integers(0, 64, 2)
    img += noise[ny : ny + h, nx : nx + w]
    return Image.fromarray(np.clip(img + 0.5, 0, 255).astype(np.uint8), "RGB")
