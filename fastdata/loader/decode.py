"""Where the torch backend decodes JPEG shards: on the host, or on a CUDA device; and on the
host, only where each image's crop needs it."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fastdata._optional import available
from fastdata.checks import choice
from fastdata.kernels import jpeg

JPEG_DECODES = ("auto", "cpu", "gpu")


def jpeg_decode_where(choice_: str, device, encoding: str, per_sample: bool) -> str:
    """Where the torch backend decodes JPEG shards: ``"gpu"`` (nvJPEG, through torchvision's
    batched ``decode_jpeg`` on the device: no decode on the host cores, which a GPU node has
    few of per GPU) or ``"cpu"`` (libjpeg-turbo in the reader threads). ``"auto"``: the GPU
    where the batches go to a CUDA device and torchvision can decode there, and no
    ``sample_transform`` needs the pixels on the host."""
    choice("jpeg_decode", choice_, JPEG_DECODES)
    if choice_ == "cpu" or encoding != "jpeg" or per_sample:
        if choice_ == "gpu":
            why = ("a sample_transform needs the decoded pixels on the host" if per_sample else
                   f"it decodes JPEG shards; this set stores {encoding}")
            raise ValueError(f"jpeg_decode='gpu' is not possible here: {why}; leave it 'auto'")
        return "cpu"
    if device.type != "cuda":
        if choice_ == "gpu":
            raise ValueError(f"jpeg_decode='gpu' needs a CUDA device, not {device}; use 'auto' "
                             f"or 'cpu'")
        return "cpu"
    ok, why = gpu_jpeg_available()
    if not ok and choice_ == "gpu":
        raise ImportError(f"jpeg_decode='gpu' needs torchvision's decode_jpeg on CUDA: {why}")
    return "gpu" if ok else "cpu"


def gpu_jpeg_available() -> tuple[bool, str]:
    """Whether torchvision can decode JPEGs on a CUDA device (a torchvision built for this
    torch, 0.19 or newer for batches); the reason where not."""
    ok, why = available("torchvision")
    if not ok:
        return False, why
    import inspect

    from torchvision.io import decode_jpeg
    if "device" not in inspect.signature(decode_jpeg).parameters:
        return False, "this torchvision's decode_jpeg has no device argument (0.19 or newer)"
    return True, ""


def decode_regions(payloads: Sequence, boxes: torch.Tensor, out: torch.Tensor,
                   whole: Callable[[int], None]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each JPEG record decoded only where its crop box needs it (``kernels.jpeg``), into its
    slot of ``out``: the rows of the box and the block-aligned columns around it, whose pixels
    inside the box are a whole decode's; its cost falls with the box's area.

    Args:
        payloads: B JPEG records of (S, S) RGB images.
        boxes: (B, 4) int64 ``[top, left, h, w]`` crop boxes inside the images.
        out: a contiguous (B, S, S, 3) uint8 CPU buffer.
        whole: ``whole(k)`` decodes record ``k`` whole into ``out[k]`` (or raises the error
            that names it): for a record the region decoder refuses, or where it was not built.

    Returns:
        ``(images, boxes)``: per record the view of ``out[k]`` that holds its decoded region
        (``out[k]`` where it was decoded whole) and the box within that view.
    """
    if not jpeg.available():
        for k in range(len(payloads)):
            whole(k)
        return list(out), boxes
    box_list = boxes.tolist()
    slots = out.numpy()
    views, within = [], []
    for k, (got, box) in enumerate(zip(jpeg.decode_regions(payloads, boxes.numpy(), out),
                                       box_list)):
        if got is None:         # refused: decoded whole, its error naming the sample
            whole(k)
            views.append(out[k])
            within.append(box)
            continue
        x0, cols = got
        views.append(torch.from_numpy(slots[k, :box[2], :cols]))
        within.append([0, box[1] - x0, box[2], box[3]])
    return views, torch.tensor(within, dtype=torch.int64).reshape(-1, 4)
