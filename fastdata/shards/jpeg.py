"""Decoding a stored JPEG record."""
from __future__ import annotations

import io

import numpy as np
import simplejpeg


def decode_jpeg(buf, out: np.ndarray) -> None:
    """Decode a stored JPEG straight into ``out`` (H, W, 3 uint8).

    simplejpeg (libjpeg-turbo, no intermediate copies, releases the GIL) gives identical pixels
    to PIL, faster. PIL stays as the fallback for what libjpeg-turbo refuses.
    """
    try:
        h, w, _, _ = simplejpeg.decode_jpeg_header(buf)
        if (h, w) != out.shape[:2]:
            raise ValueError(f"JPEG is {w}x{h}, expected {out.shape[1]}x{out.shape[0]}")
        simplejpeg.decode_jpeg(buf, colorspace="RGB", buffer=out)
        return
    except ValueError:
        pass
    from PIL import Image

    with Image.open(io.BytesIO(buf)) as im:
        out[...] = np.asarray(im.convert("RGB") if im.mode != "RGB" else im)
