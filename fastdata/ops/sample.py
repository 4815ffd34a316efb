"""The sample hook: a user's ``sample_transform(image, rng) -> image``, run per stored image
in the reader workers, before the crop, with a generator per image drawn from the batch's
seed; or a torchvision transform (any ``torch.nn.Module``), ``t(image) -> image`` on a
``(3, S, S)`` uint8 tensor, as torchvision's transforms take one."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


def takes_tensor(fn: Callable) -> bool:
    """Whether ``fn`` is called as torchvision's transforms are, ``fn(image)`` on a
    ``(3, H, W)`` tensor: a ``torch.nn.Module`` (torchvision's v1 and v2 transforms, timm's),
    or any other object of torchvision's transforms (v1's ``Compose``, ``Lambda``)."""
    return isinstance(fn, torch.nn.Module) or \
        type(fn).__module__.startswith("torchvision.transforms")


def _on_tensor(fn: Callable, image: np.ndarray) -> np.ndarray:
    """``fn`` on an ``(S, S, 3)`` uint8 image as torchvision takes it, (3, S, S) uint8, and
    its result back as (S, S, 3) (a PIL image's as it is)."""
    out = fn(torch.from_numpy(image).permute(2, 0, 1))
    return out.permute(1, 2, 0).numpy() if torch.is_tensor(out) and out.dim() == 3 else out


def sample_rngs(seed: int, n: int) -> list[np.random.Generator]:
    """The ``n`` per-image generators of a batch whose seed is ``seed``."""
    return [np.random.default_rng([seed, 1, k]) for k in range(n)]


def apply_sample_transform(fn: Callable, images: np.ndarray, seed: int,
                           name: Callable[[int], str] = str,
                           progress: list[int] | None = None) -> None:
    """``images[k] = fn(images[k], rng_k)`` for a ``(B, S, S, 3)`` uint8 batch, in place (a
    torchvision transform, ``takes_tensor``, gets each image as a (3, S, S) tensor, no ``rng``).
    ``name(k)`` says which sample image ``k`` is, for errors (e.g. its index and shard);
    ``progress[0]`` is set to ``k`` as ``fn`` starts on it (for a watcher in another thread).

    Raises:
        ValueError: ``fn`` returned an image of another shape or dtype (the sample named).
        Exception: what ``fn`` raised, with a note naming the sample (the message, before
            Python 3.11's notes).
    """
    run = (lambda image, _: _on_tensor(fn, image)) if takes_tensor(fn) else fn
    for k, rng in enumerate(sample_rngs(seed, len(images))):
        if progress is not None:
            progress[0] = k
        try:
            out = np.asarray(run(images[k].copy(), rng))
        except Exception as e:
            _note(e, f"in sample_transform={fn!r}, on {name(k)}")
            raise
        if out.shape != images.shape[1:] or out.dtype != np.uint8:
            raise ValueError(f"sample_transform returned a {out.dtype} image of shape "
                             f"{out.shape} for {name(k)}; it must return the image's shape "
                             f"{images.shape[1:]} as uint8 (the crop after it sets the size)")
        images[k] = out


def _note(e: BaseException, text: str) -> None:
    if hasattr(e, "add_note"):
        e.add_note(text)
    elif e.args and isinstance(e.args[0], str):
        e.args = (f"{e.args[0]} ({text})", *e.args[1:])
