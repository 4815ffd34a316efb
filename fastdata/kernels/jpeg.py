"""The JPEG region decoder's Python side (``_jpeg.c``, libjpeg-turbo, built where its headers
are found): a record decoded only where a crop needs it. Its arguments are checked here."""
from __future__ import annotations

import torch

from fastdata import kernels


def available() -> bool:
    """Whether the region decoder was built and imports."""
    return kernels.jpeg_decoder() is not None


def decode_region(payload, box, slot: torch.Tensor) -> tuple[int, int]:
    """The rows ``top .. top+h-1`` of the JPEG record ``payload`` (an (S, S) RGB image), in the
    block-aligned columns around ``left .. left+w-1``, into ``slot`` from its first row.

    Args:
        payload: the record (a buffer).
        box: ``(top, left, h, w)`` inside the image.
        slot: a contiguous uint8 (S, S, 3) CPU tensor.

    Returns:
        ``(x0, cols)``: the first column decoded and how many; ``slot[:h, :cols]`` holds them.

    Raises:
        ValueError: a record libjpeg-turbo refuses or of another size, or a bad box (decode
            such a record whole).
        ImportError: the decoder was not built.
    """
    module = kernels.jpeg_decoder()
    if module is None:
        raise ImportError("fastdata's JPEG region decoder (fastdata.kernels._jpeg) is not built")
    if slot.dtype != torch.uint8 or slot.device.type != "cpu" or slot.dim() != 3 \
            or slot.shape[0] != slot.shape[1] or slot.shape[2] != 3 or not slot.is_contiguous():
        raise ValueError(f"slot must be a contiguous uint8 (S, S, 3) CPU tensor, not "
                         f"{slot.dtype} {tuple(slot.shape)}")
    s = slot.shape[0]
    top, left, h, w = (int(v) for v in box)
    return module.decode_region(payload, top, left, h, w, slot.data_ptr(), 3 * s, s, s, s, s)
