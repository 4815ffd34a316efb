"""The JPEG region decoder's Python side (``_jpeg.c``, libjpeg-turbo, built where its headers
are found): records decoded only where their crops need them. Its arguments are checked
here."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fastdata import kernels


def available() -> bool:
    """Whether the region decoder was built and imports."""
    return kernels.jpeg_decoder() is not None


def decode_regions(payloads: Sequence, boxes, out: torch.Tensor
                   ) -> list[tuple[int, int] | None]:
    """Each JPEG record's rows ``top .. top+h-1``, in the block-aligned columns around
    ``left .. left+w-1``, into its slot ``out[k]`` from the slot's first row.

    Args:
        payloads: B JPEG records (buffers) of (S, S) RGB images.
        boxes: B ``(top, left, h, w)`` boxes (integers, any array-like).
        out: a contiguous uint8 (B, S, S, 3) CPU tensor.

    Returns:
        Per record ``(x0, cols)``: the first column decoded and how many (``out[k][:h, :cols]``
        holds them); None for a record libjpeg-turbo refuses, one of another size or a box
        outside the image (decode those whole).

    Raises:
        ValueError: ``out`` or the number of boxes is not as above.
        ImportError: the decoder was not built.
    """
    module = kernels.jpeg_decoder()
    if module is None:
        raise ImportError("fastdata's JPEG region decoder (fastdata.kernels._jpeg) is not built")
    b = len(payloads)
    if out.dtype != torch.uint8 or out.device.type != "cpu" or out.dim() != 4 \
            or out.shape[0] != b or out.shape[1] != out.shape[2] or out.shape[3] != 3 \
            or not out.is_contiguous() or len(boxes) != b:
        raise ValueError(f"out must be a contiguous uint8 (B, S, S, 3) CPU tensor and boxes B "
                         f"long for B = {b} records, not {out.dtype} {tuple(out.shape)} and "
                         f"{len(boxes)} boxes")
    s = out.shape[1]
    box = np.ascontiguousarray(boxes, dtype=np.int64).reshape(b, 4)
    return module.decode_regions(payloads, box, out.data_ptr(), 3 * s, 3 * s * s, s, s, s, s)
