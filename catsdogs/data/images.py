"""One image, the only place pixels are made: the article's resize, its save, its augmented copy.

The pixels are the article's: `keras.utils.load_img(target_size=...)` (convert to RGB, nearest
neighbour from the full image, aspect ratio not kept) followed by `keras.utils.save_img`, which
stretches each image's values to 0..255 (`array_to_img(scale=True)`) and saves a JPEG at
Pillow's default quality. The augmented copy is that resized image, resized to 1.25 x size with
Pillow's default filter and cropped to its top-left size x size, saved the same way.

`process_and_write` is what one of prepare's decode processes does with one candidate: decode
it fully (a truncated JPEG is rejected here, never later), make both copies and write them.
Every function takes all it needs as arguments, so it runs in any process; no framework.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from catsdogs import config


def article_jpeg(img: Image.Image) -> bytes:
    """What keras.utils.save_img(path.jpg, img) writes: min-max stretched, JPEG at quality 75.

    keras' array_to_img stretches in float32: x - min, / max, * 255, truncated to uint8. Each
    output value depends only on the input value and the image's min and max, so those same
    float32 steps applied once to the 256 possible values give a lookup table with identical
    results (bytes included), without float copies of the whole image."""
    a = np.asarray(img)  # uint8, H x W x 3
    lut = _stretch_lut(int(a.min()), int(a.max()))
    if lut is not None:  # the same table for R, G and B, as keras stretches them together
        # Image.point() would first round all 768 entries in Python, which costs more than
        # the lookup itself; the table is already whole numbers, so hand it to the core.
        img = img._new(img.im.point(lut, None))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=config.JPEG_QUALITY)
    return buf.getvalue()


@functools.cache
def _stretch_lut(lo: int, hi: int) -> list[int] | None:
    """keras' float32 min-max stretch as an RGB table for Image.point (None if it changes nothing).

    Entries outside lo..hi are never looked up (no pixel has those values); they are 0."""
    x = np.arange(256, dtype=np.float32)[lo : hi + 1]  # the values an image with this min, max holds
    x = x - np.float32(lo)  # x - np.min(x)
    x_max = np.float32(hi - lo)  # np.max(x), exactly: small whole numbers are exact in float32
    if x_max != 0:
        x /= x_max
    x *= 255
    lut = np.zeros(256, dtype=np.uint8)
    lut[lo : hi + 1] = x.astype("uint8")
    if np.array_equal(lut[lo : hi + 1], np.arange(lo, hi + 1)):
        return None
    return lut.tolist() * 3


def resize_like_article(img: Image.Image, size: int) -> Image.Image:
    """keras.utils.load_img(target_size=(size, size)): RGB, nearest neighbour, aspect not kept."""
    if img.mode != "RGB":
        img = img.convert("RGB")
    if img.size != (size, size):
        img = img.resize((size, size), Image.NEAREST)
    return img


def augment_like_article(photo: Image.Image, size: int) -> Image.Image:
    """photo.resize((big, big)).crop((0, 0, size, size)), Pillow's default filter (bicubic)."""
    big = round(size * config.AUGMENT_SCALE)
    if (size * size) % big == 0:
        # Only the top-left size x size of the big image is kept. Pillow computes each output
        # pixel's filter weights from the scale (here side / size == size / big exactly) and
        # clips its window to the whole source image, not to the box, so resizing just the
        # source box that maps onto the crop gives the same pixels with 36 % less work.
        side = size * size // big
        return photo.resize((size, size), box=(0, 0, side, side))
    return photo.resize((big, big)).crop((0, 0, size, size))


def process_image(path: str, size: int, max_pixels: int, augment: bool = True) -> tuple[str, object]:
    """Fully decode one candidate. ('ok', (standard_jpeg, augmented_jpeg, mode)) or ('rejected', reason).

    Runs in a worker process; everything it needs comes in as arguments. With augment=False
    (a candidate that can only land in the test split) augmented_jpeg is None."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        return "rejected", f"unreadable: {e.strerror or e}"
    if not data:
        return "rejected", "empty file (0 bytes)"
    Image.MAX_IMAGE_PIXELS = max_pixels  # Pillow refuses at twice this in open(); we check at 1x
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # decode warnings are not failures; errors are
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            if width * height > max_pixels:
                return "rejected", f"decompression bomb ({width}x{height} pixels declared)"
            img.load()  # verify() lets truncated JPEGs through; only a full decode catches them
            mode = img.mode
            photo = resize_like_article(img, size)
            standard = article_jpeg(photo)
            augmented = article_jpeg(augment_like_article(photo, size)) if augment else None
    except Image.DecompressionBombError as e:
        return "rejected", f"decompression bomb ({e})"
    except UnidentifiedImageError:
        return "rejected", "not an image Pillow can identify"
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        return "rejected", f"undecodable: {e}"
    return "ok", (standard, augmented, mode)


def write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def process_and_write(path: str, size: int, max_pixels: int, augment: bool,
                      targets: tuple[str, str, str]) -> tuple[str, object]:
    """process_image(), then write its JPEGs to targets = (standard, augmented folder's original,
    augmented copy); the original is a hard link to the standard file where the filesystem
    allows: creating a file can cost more CPU than encoding it, a link next to nothing.

    ('ok', (standard SHA-256, augmented SHA-256 or None, mode)) or ('rejected', reason). Writing
    in the workers spreads the cost of creating files over them."""
    status, payload = process_image(path, size, max_pixels, augment)
    if status != "ok":
        return status, payload
    standard, augmented, mode = payload
    std_path, orig_path, aug_path = targets
    write_file(std_path, standard)
    if augmented is not None:
        try:
            os.link(std_path, orig_path)
        except OSError:  # a filesystem without hard links
            write_file(orig_path, standard)
        write_file(aug_path, augmented)
    digest = hashlib.sha256(standard).digest()
    return "ok", (digest, augmented and hashlib.sha256(augmented).digest(), mode)
