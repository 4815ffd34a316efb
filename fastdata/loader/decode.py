"""Where the torch backend decodes JPEG shards: on the host, or on a CUDA device."""
from __future__ import annotations

from fastdata._optional import available
from fastdata.checks import choice

JPEG_DECODES = ("auto", "cpu", "gpu")


def jpeg_decode_where(choice_: str, device, encoding: str, backend: str, per_sample: bool) -> str:
    """Where the torch backend decodes JPEG shards: ``"gpu"`` (nvJPEG, through torchvision's
    batched ``decode_jpeg`` on the device: no decode on the host cores, which a GPU node has
    few of per GPU) or ``"cpu"`` (libjpeg-turbo in the reader threads). ``"auto"``: the GPU
    where the batches go to a CUDA device and torchvision can decode there, and no
    ``sample_transform`` needs the pixels on the host."""
    choice("jpeg_decode", choice_, JPEG_DECODES)
    if choice_ == "cpu" or encoding != "jpeg" or backend != "torch" or per_sample:
        if choice_ == "gpu":
            why = ("a sample_transform needs the decoded pixels on the host" if per_sample else
                   f"it decodes JPEG shards in the torch backend; this set stores {encoding} "
                   f"and backend={backend!r}")
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
