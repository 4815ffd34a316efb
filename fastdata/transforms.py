"""Users' augmentations: the per-sample hook and batch operations on the output device.

A ``Loader`` runs, per batch::

    stored uint8 image → sample_transform (CPU, per image, in the reader workers)
      → built-in crop/resize/flip → values in [0, 1]
      → batch_transform (the output device, whole batch) → (x - mean) / std, dtype, layout

``sample_transform(image, rng)`` takes the stored ``(S, S, 3)`` uint8 image and a
``numpy.random.Generator`` and returns an image of the same shape (an array or a PIL image). It
runs *before* the crop: the crop then runs where it is fastest (fused with normalisation on the
CPU, batched on a GPU), which an op after it would force back onto the host.

``batch_transform(images, labels)`` (optionally with a ``generator`` keyword) takes ``(B, 3, H,
W)`` float32 images in [0, 1], where colour ops are defined (torchvision's ColorJitter expects
them), and the labels (int64 ``(B,)``, or float ``(B, C)``), and returns both. The operations
here are such transforms, composable with ``Compose`` and ``RandomChoice``. Each draws what is
per image on the images' device and what is per batch on the host, from the ``generator`` the
loader passes (seeded by ``(seed, epoch, rank, batch)``), so no op makes the host wait for the
device and both backends draw the same values.
"""
from __future__ import annotations

import copy
import functools
import inspect
import math
import numbers
from typing import Callable, Sequence

import numpy as np
import torch

from fastdata import native

# RGB → luma, as torchvision's rgb_to_grayscale (ITU-R 601-2)
_LUMA = (0.2989, 0.587, 0.114)


# ---- the per-sample hook ----
def sample_rngs(seed: int, n: int) -> list[np.random.Generator]:
    """The ``n`` per-image generators of a batch whose seed is ``seed``."""
    return [np.random.default_rng([seed, 1, k]) for k in range(n)]


def apply_sample_transform(fn: Callable, images: np.ndarray, seed: int) -> None:
    """``images[k] = fn(images[k], rng_k)`` for a ``(B, S, S, 3)`` uint8 batch, in place.

    Raises:
        ValueError: ``fn`` returned an image of another shape or dtype.
    """
    for k, rng in enumerate(sample_rngs(seed, len(images))):
        out = np.asarray(fn(images[k].copy(), rng))
        if out.shape != images.shape[1:] or out.dtype != np.uint8:
            raise ValueError(f"sample_transform returned a {out.dtype} image of shape "
                             f"{out.shape}; it must return the image's shape "
                             f"{images.shape[1:]} as uint8 (the crop after it sets the size)")
        images[k] = out


# ---- the batch hook ----
def takes_generator(fn: Callable) -> bool:
    """Whether ``fn`` accepts a ``generator`` keyword."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "generator" or p.kind is p.VAR_KEYWORD for p in params)


def call(fn: Callable, images, labels, generator):
    out = fn(images, labels, generator=generator) if takes_generator(fn) else fn(images, labels)
    if not (isinstance(out, tuple) and len(out) == 2 and torch.is_tensor(out[0])):
        raise TypeError(f"batch_transform {fn!r} returned {type(out).__name__}; it must return "
                        f"(images, labels)")
    return out


def batch_generator(seed: int, device: torch.device) -> torch.Generator:
    """The generator a batch transform gets for the batch whose seed is ``seed``."""
    g = torch.Generator(device=device)
    g.manual_seed(int(np.random.SeedSequence([seed, 2]).generate_state(1, np.uint64)[0] >> 1))
    return g


def _host(generator: torch.Generator | None) -> torch.Generator | None:
    """A CPU generator for a transform's per-batch values: ``generator`` itself on the CPU.
    From a device's generator, one seeded on the host (no device value read), a stream of
    its own at each call (the device generator's offset moves on), the first the same as a
    CPU generator of the same seed gives."""
    if generator is None or generator.device.type == "cpu":
        return generator
    seed, offset = generator.initial_seed(), generator.get_offset()
    generator.set_offset(offset + 4)
    if offset:
        seed = int(np.random.SeedSequence([seed, offset]).generate_state(1, np.uint64)[0] >> 1)
    return torch.Generator().manual_seed(seed)


def _to(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-batch values drawn on the host, on ``like``'s device in one copy: from pinned
    memory on CUDA, as a copy from pageable memory waits for the stream's earlier work."""
    if values.device == like.device:
        return values
    if like.is_cuda and values.device.type == "cpu":
        values = values.pin_memory()
    return values.to(like.device, non_blocking=True)


@functools.lru_cache(maxsize=256)
def _constant(values: tuple, device: str, dtype: torch.dtype) -> torch.Tensor:
    """``values`` as a tensor on ``device``, made once: a copy from pageable host memory to a
    GPU would make the host wait for the stream's earlier work at every batch."""
    return torch.tensor(values, dtype=dtype).to(device)


def _coins(n: int, p: float, host) -> torch.Tensor:
    """``n`` draws of True with probability ``p``, on the host, shaped (n, 1, 1, 1)."""
    return (torch.rand(n, generator=host) < p).view(n, 1, 1, 1)


class BatchTransform:
    """Base of the batch operations: ``op(images, labels, generator=None) -> (images,
    labels)``. ``images``: ``(B, 3, H, W)`` float in [0, 1]; ``generator``: a
    ``torch.Generator`` on the images' device (None: torch's default one). An operation may
    write into ``images`` (the loader's batch, made for this call): pass a copy to keep
    yours."""

    def __call__(self, images: torch.Tensor, labels: torch.Tensor,
                 generator: torch.Generator | None = None):
        raise NotImplementedError

    def fold_normalization(self, scale: tuple, shift: tuple) -> "BatchTransform | None":
        """This transform returning ``x * scale + shift`` per channel (the loader's
        normalisation, folded into its last pass over the pixels), with the same draws; None
        where it has no such form. A loader runs it in place of the two."""
        return None

    def after_normalization(self, scale: tuple, shift: tuple) -> "BatchTransform | None":
        """The transform that does to ``x * scale + shift`` what this one does to ``x``, with
        the same draws (so the normalisation may run before it); None where there is none."""
        return None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class Compose(BatchTransform):
    """Apply ``transforms`` in order, each with the same generator (its draws advance it)."""

    def __init__(self, transforms: Sequence[Callable]):
        self.transforms = list(transforms)
        for t in self.transforms:
            if not callable(t):
                raise TypeError(f"Compose takes callables; {t!r} is not one")

    def __call__(self, images, labels, generator=None):
        for t in self.transforms:
            images, labels = call(t, images, labels, generator)
        return images, labels

    def fold_normalization(self, scale, shift):
        """The last transform that folds it in, where every one after it can run after it."""
        after: list = []
        for k in range(len(self.transforms) - 1, -1, -1):
            t = self.transforms[k]
            folded = _ask(t, "fold_normalization", scale, shift)
            if folded is not None:
                return Compose([*self.transforms[:k], folded, *after])
            moved = _ask(t, "after_normalization", scale, shift)
            if moved is None:
                return None
            after.insert(0, moved)
        return None

    def after_normalization(self, scale, shift):
        moved = _each(self.transforms, "after_normalization", scale, shift)
        return None if moved is None else Compose(moved)


def _ask(t, method: str, scale: tuple, shift: tuple) -> BatchTransform | None:
    """``t.fold_normalization`` or ``t.after_normalization`` (``method``) of ``scale`` and
    ``shift``; None where ``t`` is not a ``BatchTransform``, or where it runs a ``__call__`` of
    a subclass's that the method does not come with (one that may ignore what it asks)."""
    if not isinstance(t, BatchTransform):
        return None
    mro = type(t).__mro__
    runs = next(c for c in mro if "__call__" in vars(c))
    has = next(c for c in mro if method in vars(c))
    if runs.__module__ != __name__ and not issubclass(has, runs):
        return None
    return getattr(t, method)(scale, shift)


def _each(transforms: list, method: str, scale: tuple, shift: tuple) -> list | None:
    """``_ask`` of each transform, or None where one has none."""
    out = [_ask(t, method, scale, shift) for t in transforms]
    return None if any(t is None for t in out) else out


class RandomChoice(BatchTransform):
    """One of ``transforms`` per batch, with probabilities ``p`` (None: equal), as timm and
    torchvision's references pick MixUp or CutMix."""

    def __init__(self, transforms: Sequence[Callable], p: Sequence[float] | None = None):
        self.transforms = list(transforms)
        if not self.transforms:
            raise ValueError("RandomChoice needs at least one transform")
        p = [1.0] * len(self.transforms) if p is None else [float(v) for v in p]
        if len(p) != len(self.transforms) or min(p) < 0 or sum(p) <= 0:
            raise ValueError(f"p={p!r} is not valid; give {len(self.transforms)} weights >= 0 "
                             f"with a positive sum")
        self.p = [v / sum(p) for v in p]

    def __call__(self, images, labels, generator=None):
        u = float(torch.rand((), generator=_host(generator)))
        k = min(int(np.searchsorted(np.cumsum(self.p), u, side="right")), len(self.p) - 1)
        return call(self.transforms[k], images, labels, generator)

    def fold_normalization(self, scale, shift):
        return self._each("fold_normalization", scale, shift)

    def after_normalization(self, scale, shift):
        return self._each("after_normalization", scale, shift)

    def _each(self, method, scale, shift):
        out = _each(self.transforms, method, scale, shift)
        return None if out is None else RandomChoice(out, self.p)


def _range(name: str, value, centre: float, low: float, high: float) -> tuple[float, float]:
    """torchvision's ColorJitter arguments: ``v`` → ``[centre - v, centre + v]`` clipped to
    ``[low, high]``, or an explicit ``(lo, hi)``."""
    if isinstance(value, numbers.Real):
        if value < 0:
            raise ValueError(f"{name}={value!r} is not valid; use a number >= 0 or (lo, hi)")
        lo, hi = centre - float(value), centre + float(value)
    else:
        try:
            lo, hi = (float(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}={value!r} is not valid; use a number >= 0 or (lo, hi)") \
                from None
    if not low <= lo <= hi <= high:
        raise ValueError(f"{name}={value!r} is not valid; it must lie within [{low}, {high}]")
    return max(lo, low), hi


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """``(B, 3, H, W)`` → ``(B, 1, H, W)`` luma."""
    r, g, b = x.unbind(1)
    return (_LUMA[0] * r + _LUMA[1] * g + _LUMA[2] * b).unsqueeze(1)


def _blend(a: torch.Tensor, b, f: torch.Tensor) -> torch.Tensor:
    return (f * a + (1 - f) * b).clamp_(0, 1)


def adjust_brightness(x, f):
    return _blend(x, 0.0, f)


def adjust_contrast(x, f):
    return _blend(x, grayscale(x).mean(dim=(-3, -2, -1), keepdim=True), f)


def adjust_saturation(x, f):
    return _blend(x, grayscale(x), f)


def adjust_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate each image's hue by ``shift`` (in turns, per image), as torchvision's
    ``adjust_hue`` on tensors: through HSV and back."""
    r, g, b = x.unbind(1)
    maxc, _ = x.max(1)
    minc, _ = x.min(1)
    delta = maxc - minc
    eq = maxc == minc
    safe = torch.where(eq, torch.ones_like(delta), delta)
    s = delta / torch.where(eq, torch.ones_like(maxc), maxc)
    rc, gc, bc = ((maxc - c) / safe for c in (r, g, b))
    h = torch.where(maxc == r, bc - gc,
                    torch.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    h = torch.fmod(h / 6.0 + 1.0, 1.0)
    h = torch.where(eq, torch.zeros_like(h), h)
    h = torch.remainder(h + shift.view(-1, 1, 1), 1.0)
    v = maxc
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.to(torch.int64) % 6
    p, q, t = (v * (1 - s)).clamp(0, 1), (v * (1 - s * f)).clamp(0, 1), \
        (v * (1 - s * (1 - f))).clamp(0, 1)
    sel = [(v, q, p, p, t, v), (t, v, v, q, p, p), (p, p, t, v, v, q)]
    out = [sum(torch.where(i == k, c[k], 0.0) for k in range(6)) for c in sel]
    return torch.stack(out, 1)


class ColorJitter(BatchTransform):
    """torchvision's ``ColorJitter``, a factor per image: brightness, contrast and saturation
    factors uniform in ``[max(0, 1 - v), 1 + v]``, a hue shift uniform in ``[-hue, hue]``
    (``hue`` <= 0.5), each given as ``v`` or ``(lo, hi)``. The order of the four adjustments
    is drawn once per batch (torchvision draws it per call, which is per image in a per-image
    pipeline)."""

    def __init__(self, brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0):
        self.brightness = _range("brightness", brightness, 1.0, 0.0, math.inf)
        self.contrast = _range("contrast", contrast, 1.0, 0.0, math.inf)
        self.saturation = _range("saturation", saturation, 1.0, 0.0, math.inf)
        self.hue = _range("hue", hue, 0.0, -0.5, 0.5)
        self._affine: tuple | None = None      # (scale, shift) folded in, per channel

    def fold_normalization(self, scale, shift):
        folded = copy.copy(self)
        folded._affine = (tuple(scale), tuple(shift))
        return folded

    def __call__(self, images, labels, generator=None):
        n = len(images)
        ops = [(adjust_brightness, self.brightness, (1.0, 1.0)),
               (adjust_contrast, self.contrast, (1.0, 1.0)),
               (adjust_saturation, self.saturation, (1.0, 1.0)),
               (adjust_hue, self.hue, (0.0, 0.0))]
        host = _host(generator)
        order = [k for k in torch.randperm(4, generator=host).tolist()
                 if ops[k][1] != ops[k][2]]
        lo, hi = (torch.tensor([r[j] for _, r, _ in ops]) for j in (0, 1))
        factors = _to(lo + (hi - lo) * torch.rand(n, 4, generator=host), images)   # (B, 4)
        affine = self._affine or (None, None)
        if _native_ok(images):          # per pixel in one or two passes, not per op
            native.color_jitter(images, factors, order, *affine)
            return images, labels
        if _fused_gpu_ok(images):       # the same, in a Triton kernel
            gpu_kernels().color_jitter(images, factors, order, *affine)
            return images, labels
        for k in order:
            images = ops[k][0](images, factors[:, k].view(n, 1, 1, 1))
        if self._affine is not None:
            images = _per_channel(images, *self._affine)
        return images, labels


def _per_channel(x: torch.Tensor, scale: tuple, shift: tuple) -> torch.Tensor:
    """``x * scale + shift`` with a value per channel of (..., 3, H, W)."""
    a, b = (_constant(tuple(v), str(x.device), x.dtype).view(3, 1, 1) for v in (scale, shift))
    return torch.addcmul(b, x, a)


def _native_ok(images: torch.Tensor) -> bool:
    return images.device.type == "cpu" and images.dtype == torch.float32 and native.available()


@functools.lru_cache(maxsize=None)
def gpu_kernels():
    """``fastdata.gpu_kernels`` where Triton imports, else None."""
    try:
        from fastdata import gpu_kernels as kernels
    except Exception:  # noqa: BLE001 - no Triton, or a broken one: the torch operations
        return None
    return kernels


def _fused_gpu_ok(images: torch.Tensor) -> bool:
    _, _, _, w = images.shape
    return (images.is_cuda and images.dtype == torch.float32 and
            images.stride(2) == w * images.stride(3) and gpu_kernels() is not None)


class RandomGrayscale(BatchTransform):
    """Each image made grey (its luma in all three channels) with probability ``p``."""

    def __init__(self, p: float = 0.1):
        self.p = _probability(p)
        self._affine: tuple | None = None      # (scale, shift) the images come normalised by

    def after_normalization(self, scale, shift):
        moved = copy.copy(self)
        moved._affine = (tuple(scale), tuple(shift))
        return moved

    def __call__(self, images, labels, generator=None):
        grey = _coins(len(images), self.p, _host(generator))
        if images.device.type == "cpu":     # the grey images only, image by image
            for k in grey.view(-1).nonzero()[:, 0].tolist():
                images[k] = self._grey(images[k:k + 1])[0]
            return images, labels
        return torch.where(_to(grey, images), self._grey(images).expand_as(images),
                           images), labels

    def _grey(self, x: torch.Tensor) -> torch.Tensor:
        if self._affine is None:
            return grayscale(x)
        # the luma of the values before normalisation, then normalised as each channel
        scale, shift = self._affine
        w = [l / a for l, a in zip(_LUMA, scale)]
        luma = w[0] * x[:, 0] + w[1] * x[:, 1] + w[2] * x[:, 2] - sum(
            wc * b for wc, b in zip(w, shift))
        return _per_channel(luma.unsqueeze(1), scale, shift)


def _fill_values(value) -> tuple:
    """A number or numbers as a tuple of floats; () where they are not finite numbers."""
    try:
        values = np.ravel(np.asarray(value, dtype=float))
    except (TypeError, ValueError):
        return ()
    return tuple(values.tolist()) if np.isfinite(values).all() else ()


def _probability(p) -> float:
    if not isinstance(p, numbers.Real) or not 0 <= p <= 1:
        raise ValueError(f"p={p!r} is not valid; use a probability in [0, 1]")
    return float(p)


class RandomErasing(BatchTransform):
    """torchvision's ``RandomErasing``: with probability ``p``, a box of ``scale`` of the
    image's area and aspect ratio in ``ratio`` (log-uniform), 10 attempts to fit, is set to
    ``value`` (a number, 3 numbers, or ``"random"`` for normal noise)."""

    def __init__(self, p: float = 0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0.0):
        self.p = _probability(p)
        self.scale, self.ratio = tuple(map(float, scale)), tuple(map(float, ratio))
        if not 0 < self.scale[0] <= self.scale[1] <= 1 or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"scale={scale!r} or ratio={ratio!r} is not valid; use (lo, hi) with "
                             f"0 < lo <= hi (<= 1 for scale)")
        random = isinstance(value, str) and value == "random"
        self.value = "random" if random else _fill_values(value)
        if not random and len(self.value) not in (1, 3):
            raise ValueError(f"value={value!r} is not valid; use a number, 3 numbers or "
                             f"'random'")
        self._affine: tuple | None = None      # (scale, shift): the fill mapped as the pixels

    def after_normalization(self, scale, shift):
        moved = copy.copy(self)
        moved._affine = (tuple(scale), tuple(shift))
        return moved

    def boxes(self, n: int, height: int, width: int, like: torch.Tensor, generator):
        """``(n, 4)`` int64 ``top, left, h, w`` per image (``h == 0``: nothing erased), drawn
        on the host and put on ``like``'s device."""
        attempts, host = 10, _host(generator)
        area = height * width * (self.scale[0] + (self.scale[1] - self.scale[0]) *
                                 torch.rand(n, attempts, generator=host))
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = torch.exp(lo + (hi - lo) * torch.rand(n, attempts, generator=host))
        h = torch.sqrt(area * aspect).round().long()
        w = torch.sqrt(area / aspect).round().long()
        ok = (h < height) & (w < width)
        first = ok.to(torch.float32).argmax(1, keepdim=True)
        found = ok.any(1) & _coins(n, self.p, host).view(n)
        h = torch.where(found, h.gather(1, first)[:, 0], 0)
        w = torch.where(found, w.gather(1, first)[:, 0], 0)
        u = torch.rand(n, 2, generator=host)
        top = (u[:, 0] * (height - h + 1)).long()
        left = (u[:, 1] * (width - w + 1)).long()
        return _to(torch.stack([top, left, h, w], 1), like)

    def _fill(self, shape, images, generator) -> torch.Tensor:
        if self.value == "random":
            noise = torch.randn(shape, device=images.device, generator=generator,
                                dtype=images.dtype)
            return noise if self._affine is None else _per_channel(noise, *self._affine)
        value = np.broadcast_to(np.array(self.value), 3)
        if self._affine is not None:
            value = value * np.array(self._affine[0]) + np.array(self._affine[1])
        return _constant(tuple(value.tolist()), str(images.device), images.dtype) \
            .reshape(3, 1, 1)

    def __call__(self, images, labels, generator=None):
        n, c, height, width = images.shape
        boxes = self.boxes(n, height, width, images, generator)
        if images.device.type == "cpu":     # the boxes only, image by image
            for k, (t, l, h, w) in enumerate(boxes.tolist()):
                if h:
                    box = images[k, :, t:t + h, l:l + w]
                    box.copy_(self._fill(box.shape, images, generator).expand_as(box))
            return images, labels
        if self.value != "random" and images.is_cuda and gpu_kernels() is not None:
            fill = self._fill(images.shape, images, generator).reshape(3)
            gpu_kernels().erase(images, boxes, fill)     # the boxes only
            return images, labels
        top, left, h, w = (t.view(n, 1, 1, 1) for t in boxes.unbind(1))
        ys = torch.arange(height, device=images.device).view(1, 1, height, 1)
        xs = torch.arange(width, device=images.device).view(1, 1, 1, width)
        inside = (ys >= top) & (ys < top + h) & (xs >= left) & (xs < left + w)
        return torch.where(inside, self._fill(images.shape, images, generator), images), labels


def soft_targets(labels: torch.Tensor, num_classes: int, dtype=torch.float32) -> torch.Tensor:
    """Class indices ``(B,)`` → one-hot ``(B, C)``; soft ``(B, C)`` targets as they are."""
    if labels.dim() == 2:
        if labels.shape[1] != num_classes:
            raise ValueError(f"labels of shape {tuple(labels.shape)} do not have "
                             f"num_classes={num_classes} columns")
        return labels.to(dtype)
    out = torch.zeros((len(labels), num_classes), dtype=dtype, device=labels.device)
    return out.scatter_(1, labels.view(-1, 1), 1.0)


def check_classes(fn: Callable, classes: int) -> None:
    """Refuse a MixUp or CutMix in ``fn`` (through Compose and RandomChoice) with fewer
    ``num_classes`` than a set of class labels has: on a GPU its one-hot targets would fail
    inside a kernel, which takes the process's CUDA context down with it.

    Raises:
        ValueError: naming the operation and the number of classes to use.
    """
    for t in fn.transforms if isinstance(fn, (Compose, RandomChoice)) else ():
        check_classes(t, classes)
    if isinstance(fn, _Mix) and fn.num_classes < classes:
        raise ValueError(f"{type(fn).__name__}(num_classes={fn.num_classes}) cannot hold this "
                         f"set's labels: it has {classes} classes; use num_classes={classes}")


class _Mix(BatchTransform):
    def __init__(self, alpha: float = 1.0, *, num_classes: int):
        if not isinstance(alpha, numbers.Real) or alpha <= 0:
            raise ValueError(f"alpha={alpha!r} is not valid; use a number > 0")
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes={num_classes!r} is not valid; use an integer >= 1")
        self.alpha, self.num_classes = float(alpha), num_classes

    def after_normalization(self, scale, shift):
        return self     # a blend of two images, weights summing to 1: it commutes

    def _lam(self, host) -> tuple[float, np.random.Generator]:
        """λ ~ Beta(alpha, alpha), and a generator for the rest of the batch's values."""
        seed = int(torch.randint(2 ** 62, (), generator=host))
        rng = np.random.default_rng(seed)
        return float(rng.beta(self.alpha, self.alpha)), rng


class MixUp(_Mix):
    """torchvision's ``MixUp``: one λ ~ Beta(alpha, alpha) per batch; each image and its
    one-hot target blended with the batch's previous one (``roll(1, 0)``): ``λ·a + (1-λ)·b``.
    Labels become float ``(B, num_classes)``."""

    def __call__(self, images, labels, generator=None):
        lam, _ = self._lam(_host(generator))
        y = soft_targets(labels, self.num_classes)
        if images.device.type == "cpu":     # in place, image by image, from the last one
            last = images[-1].clone()
            for k in range(len(images) - 1, 0, -1):
                images[k].lerp_(images[k - 1], 1 - lam)
            images[0].lerp_(last, 1 - lam)
        else:       # lerp(images, images.roll(1, 0)) without the rolled copy
            out = torch.empty_like(images)
            torch.lerp(images[1:], images[:-1], 1 - lam, out=out[1:])
            torch.lerp(images[:1], images[-1:], 1 - lam, out=out[:1])
            images = out
        return images, y.lerp(y.roll(1, 0), 1 - lam)


class CutMix(_Mix):
    """torchvision's ``CutMix``: one λ ~ Beta(alpha, alpha) and one box per batch (centre
    uniform, sides ``sqrt(1-λ)`` of the image's, clipped); the box is pasted from the batch's
    previous image (``roll(1, 0)``) and targets mixed by the area kept. Labels become float
    ``(B, num_classes)``."""

    def __call__(self, images, labels, generator=None):
        lam, rng = self._lam(_host(generator))
        height, width = images.shape[-2:]
        cy, cx = int(rng.integers(height)), int(rng.integers(width))
        r = 0.5 * math.sqrt(1.0 - lam)
        rh, rw = int(r * height), int(r * width)
        y0, y1 = max(cy - rh, 0), min(cy + rh, height)
        x0, x1 = max(cx - rw, 0), min(cx + rw, width)
        box = images[..., y0:y1, x0:x1]
        box.copy_(box.roll(1, 0))       # in place: only the box is read and written
        kept = 1.0 - (y1 - y0) * (x1 - x0) / (height * width)
        y = soft_targets(labels, self.num_classes)
        return images, y.lerp(y.roll(1, 0), 1 - kept)


# ---- TrivialAugment, batched: an operation and a magnitude per image ----
def adjust_sharpness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """torchvision's: blend with the image smoothed by [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13
    (its border pixels kept)."""
    smooth = x.clone()
    if x.is_cuda:       # one depthwise convolution
        kernel = _constant(((1.0, 1.0, 1.0), (1.0, 5.0, 1.0), (1.0, 1.0, 1.0)), str(x.device),
                           x.dtype) / 13
        smooth[..., 1:-1, 1:-1] = torch.nn.functional.conv2d(x, kernel.expand(3, 1, 3, 3),
                                                             groups=3)
    else:               # a 3x3 box as two 3-sums, plus 4x the centre: several times faster
        box = x[..., :-2, :] + x[..., 1:-1, :] + x[..., 2:, :]
        box = box[..., :-2] + box[..., 1:-1] + box[..., 2:]
        smooth[..., 1:-1, 1:-1] = box.add_(x[..., 1:-1, 1:-1], alpha=4).div_(13)
    return _blend(x, smooth, f)


def _as_levels(x: torch.Tensor) -> torch.Tensor:
    """[0, 1] values as the uint8 levels the PIL definitions work on, whole numbers in
    ``x``'s dtype."""
    return (x * 255).round_().clamp_(0, 255)


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """Keep the top ``bits`` (per image, 1-8) of each 8-bit level."""
    # a level's low bits cleared: floor(level / 2^k) * 2^k, exact in floats (no int64 copy)
    step = torch.exp2(8 - bits.to(x.dtype).round()).view(-1, 1, 1, 1)
    return torch.floor(_as_levels(x) / step).mul_(step).div_(255)


def solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Invert the values at or above ``threshold`` (per image, in [0, 1])."""
    # a lerp by 0 or 1 picks exactly, and runs many times faster than torch.where on a CPU
    return torch.lerp(x, 1 - x, (x >= threshold.view(-1, 1, 1, 1)).to(x.dtype))


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """Stretch each channel of each image to [0, 1] (unchanged where it is flat)."""
    lo = x.amin(dim=(-2, -1), keepdim=True)
    hi = x.amax(dim=(-2, -1), keepdim=True)
    flat = hi <= lo
    scale = torch.where(flat, torch.ones_like(hi), 1 / torch.where(flat, torch.ones_like(hi),
                                                                    hi - lo))
    return ((x - torch.where(flat, torch.zeros_like(lo), lo)) * scale).clamp_(0, 1)


def equalize(x: torch.Tensor) -> torch.Tensor:
    """PIL's (and torchvision's) histogram equalisation of each channel's 8-bit levels."""
    n, c, h, w = x.shape
    levels = _as_levels(x).long().reshape(n * c, h * w)
    hist = torch.zeros(n * c, 256, dtype=torch.int64, device=x.device)
    hist.scatter_add_(1, levels, torch.ones_like(levels))
    index = torch.arange(256, device=x.device)
    last = (index * (hist > 0)).argmax(1, keepdim=True)     # the highest level present
    step = (h * w - hist.gather(1, last)) // 255
    safe = step.clamp(min=1)
    lut = (hist.cumsum(1) + safe // 2) // safe
    lut = torch.cat([torch.zeros_like(lut[:, :1]), lut[:, :-1]], 1).clamp_(0, 255)
    lut = torch.where(step > 0, lut, index)        # a channel of one level: unchanged
    return (lut.to(x.dtype) / 255).gather(1, levels).view(n, c, h, w)


def affine(x: torch.Tensor, angle, shear_x, shear_y, tx, ty) -> torch.Tensor:
    """torchvision's tensor ``affine``/``rotate`` (nearest, black fill), per image: rotate by
    ``angle`` degrees about the centre, shear by ``shear_x``/``shear_y`` degrees about the top
    left corner, translate by ``tx``/``ty`` pixels. Each argument a (B,) tensor, on ``x``'s
    device or on the host (the matrices are then made there and moved in one copy)."""
    n, _, h, w = x.shape
    theta = _to(_sampling_matrices(angle, shear_x, shear_y, tx, ty, h, w), x)
    xs = torch.linspace(-w * 0.5 + 0.5, w * 0.5 - 0.5, w, device=x.device).view(1, 1, w, 1)
    ys = torch.linspace(-h * 0.5 + 0.5, h * 0.5 - 0.5, h, device=x.device).view(1, h, 1, 1)
    # (x, y, 1) @ theta per pixel, as broadcast products written once into the grid (a batched
    # matmul with an inner size of 3 ran several times slower on a CPU)
    t = theta.view(n, 3, 1, 1, 2)
    grid = torch.add(xs * t[:, 0], ys * t[:, 1]).add_(t[:, 2])
    return torch.nn.functional.grid_sample(x, grid.to(x.dtype), mode="nearest",
                                           padding_mode="zeros", align_corners=False)


def _sampling_matrices(angle, shear_x, shear_y, tx, ty, h: int, w: int) -> torch.Tensor:
    """(B, 3, 2): an output pixel's ``(x, y, 1)`` (from the centre) times its image's matrix is
    where it samples, in ``grid_sample``'s units."""
    # torchvision's _get_inverse_affine_matrix (rotate passes -angle to it)
    rot, sx, sy = (torch.deg2rad(t.to(torch.float32)) for t in (-angle, shear_x, shear_y))
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -torch.cos(rot - sy) * torch.tan(sx) / torch.cos(sy) - torch.sin(rot)
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = -torch.sin(rot - sy) * torch.tan(sx) / torch.cos(sy) + torch.cos(rot)
    # shears turn about the top left corner, rotations about the centre (TrivialAugment's)
    shear = (shear_x != 0) | (shear_y != 0)
    cx = torch.where(shear, torch.full_like(a, -w * 0.5), torch.zeros_like(a))
    cy = torch.where(shear, torch.full_like(a, -h * 0.5), torch.zeros_like(a))
    tx, ty = tx.to(a.dtype), ty.to(a.dtype)
    m = torch.stack([d, -b, torch.zeros_like(a), -c, a, torch.zeros_like(a)], 1)
    m[:, 2] += m[:, 0] * (-cx - tx) + m[:, 1] * (-cy - ty) + cx
    m[:, 5] += m[:, 3] * (-cx - tx) + m[:, 4] * (-cy - ty) + cy
    theta = m.view(-1, 2, 3).transpose(1, 2)
    return torch.stack([theta[..., 0] / (0.5 * w), theta[..., 1] / (0.5 * h)], -1)


def _degrees_of_slope(m):
    return torch.rad2deg(torch.atan(m))


# the geometric operations: name -> (which of affine's angle, shear_x, shear_y, tx, ty the
# magnitude sets, and how)
_AFFINE_ARGS = {"shear_x": (1, _degrees_of_slope), "shear_y": (2, _degrees_of_slope),
                "translate_x": (3, torch.trunc), "translate_y": (4, torch.trunc),
                "rotate": (0, lambda m: m)}


def _affine_args(ops: list, op: torch.Tensor, mag: torch.Tensor) -> list:
    """affine's 5 arguments per image: its geometric operation's, zeros for the others."""
    args = [torch.zeros_like(mag) for _ in range(5)]
    for k, name in enumerate(ops):
        if name in _AFFINE_ARGS:
            slot, fn = _AFFINE_ARGS[name]
            args[slot] = torch.where(op == k, fn(mag), args[slot])
    return args


def _geometric(name: str) -> Callable:
    return lambda x, m: affine(x, *_affine_args([name], torch.zeros_like(m), m))


# name -> (largest magnitude, signed, fn(images, magnitudes)); torchvision's TrivialAugmentWide
TRIVIAL_OPS = {
    "identity": (0.0, False, lambda x, m: x),
    "shear_x": (0.99, True, _geometric("shear_x")),
    "shear_y": (0.99, True, _geometric("shear_y")),
    "translate_x": (32.0, True, _geometric("translate_x")),
    "translate_y": (32.0, True, _geometric("translate_y")),
    "rotate": (135.0, True, _geometric("rotate")),
    "brightness": (0.99, True, lambda x, m: adjust_brightness(x, 1 + m.view(-1, 1, 1, 1))),
    "color": (0.99, True, lambda x, m: adjust_saturation(x, 1 + m.view(-1, 1, 1, 1))),
    "contrast": (0.99, True, lambda x, m: adjust_contrast(x, 1 + m.view(-1, 1, 1, 1))),
    "sharpness": (0.99, True, lambda x, m: adjust_sharpness(x, 1 + m.view(-1, 1, 1, 1))),
    "posterize": (6.0, False, lambda x, m: posterize(x, 8 - m.round())),
    "solarize": (1.0, False, lambda x, m: solarize(x, 1 - m)),
    "autocontrast": (0.0, False, lambda x, m: autocontrast(x)),
    "equalize": (0.0, False, lambda x, m: equalize(x)),
}


class TrivialAugment(BatchTransform):
    """torchvision's ``TrivialAugmentWide``, batched: each image gets one operation of
    ``ops`` (all of ``TRIVIAL_OPS`` by default) at a magnitude of ``num_bins`` levels, drawn
    per image, with a random sign where the operation has one. Geometric operations fill with
    black. Each operation runs on the images that drew it; the draws are made on the host, so
    grouping the images by operation reads nothing from a GPU."""

    def __init__(self, num_bins: int = 31, ops: Sequence[str] | None = None):
        self.ops = list(TRIVIAL_OPS) if ops is None else list(ops)
        unknown = [o for o in self.ops if o not in TRIVIAL_OPS]
        if unknown or not self.ops:
            raise ValueError(f"ops={ops!r} is not valid; choose among {', '.join(TRIVIAL_OPS)}")
        if not isinstance(num_bins, int) or num_bins < 2:
            raise ValueError(f"num_bins={num_bins!r} is not valid; use an integer >= 2")
        self.num_bins = num_bins

    def draw(self, n: int, generator):
        """``(op, magnitude)`` per image, on the host: (B,) int64 indices into ``ops`` and
        (B,) float32."""
        host = _host(generator)
        op = torch.randint(len(self.ops), (n,), generator=host)
        level = torch.randint(self.num_bins, (n,), generator=host)
        sign = torch.randint(2, (n,), generator=host) * 2 - 1
        top = torch.tensor([TRIVIAL_OPS[o][0] for o in self.ops], dtype=torch.float32)
        signed = torch.tensor([TRIVIAL_OPS[o][1] for o in self.ops])
        mag = top[op] * level / (self.num_bins - 1)
        return op, torch.where(signed[op], mag * sign, mag)

    def __call__(self, images, labels, generator=None):
        op, mag = self.draw(len(images), generator)
        if images.device.type == "cpu":
            return self.grouped(images, op, mag), labels
        return self.by_operation(images, op, mag), labels

    def grouped(self, images, op, mag):
        """Each operation on the images that drew it, in place, image by image (the CPU's)."""
        for k in torch.unique(op).tolist():
            if self.ops[k] == "identity":
                continue
            idx = (op == k).nonzero()[:, 0]
            # as planes: per-channel and per-image broadcasts run several times faster on them
            out = TRIVIAL_OPS[self.ops[k]][2](images[idx].contiguous(), mag[idx])
            # back image by image: a plain copy whatever the result's layout (an indexed
            # assignment from another layout ran several times slower)
            for j, i in enumerate(idx.tolist()):
                images[i].copy_(out[j])
        return images

    def by_operation(self, images, op, mag):
        """Each operation on the images that drew it, in place, on the batch sorted by
        operation (a GPU's): one gather and one scatter of the batch, each operation on a
        range of it, the geometric ones on one range as one resampling with each image's own
        matrix. ``op`` and ``mag`` on the host."""
        geometric = [name in _AFFINE_ARGS for name in self.ops]
        group = torch.tensor([-1 if g else k for k, g in enumerate(geometric)])[op]
        order = torch.argsort(group, stable=True)
        op, mag = op[order], mag[order]
        idx, mags = _to(order, images), _to(mag, images)
        batch = images.index_select(0, idx)
        keys, counts = torch.unique_consecutive(group[order], return_counts=True)
        start = 0
        for key, count in zip(keys.tolist(), counts.tolist()):
            part, start = slice(start, start + count), start + count
            if key < 0:
                batch[part] = affine(batch[part], *_affine_args(self.ops, op[part], mag[part]))
            elif self.ops[key] != "identity":
                batch[part] = TRIVIAL_OPS[self.ops[key]][2](batch[part], mags[part])
        return images.index_copy_(0, idx, batch)


class Normalize:
    """The loader's last step after a batch transform: ``(x - mean) / std`` in ``dtype`` and
    ``memory_format`` (with ``values=False``, the dtype and layout only: the transform did the
    rest)."""

    def __init__(self, mean, std, dtype: torch.dtype, memory_format):
        self.mean, self.std, self.dtype, self.memory_format = mean, std, dtype, memory_format
        self.scale = tuple(1 / s for s in std)
        self.shift = tuple(-m / s for m, s in zip(mean, std))

    def __call__(self, x: torch.Tensor, values: bool = True) -> torch.Tensor:
        # in place only where each element has its own memory (not, e.g., an expanded view)
        dense = x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)
        if values and dense and _native_ok(x):      # one pass, each pixel once
            native.affine(x, self.scale, self.shift)
        elif values and dense and x.dtype == torch.float32:
            a, b = (_constant(v, str(x.device), x.dtype).view(3, 1, 1)
                    for v in (self.scale, self.shift))
            x = torch.addcmul(b, x, a, out=x)
        elif values:
            x = _per_channel(x.float(), self.scale, self.shift)
        return x.to(self.dtype, memory_format=self.memory_format)


class BatchStage:
    """A loader's batch transform then normalisation, for the batch whose seed is given. Where
    the transform can fold the normalisation into its last pass over the pixels
    (``BatchTransform.fold_normalization``: e.g. ColorJitter followed by RandomGrayscale,
    RandomErasing, MixUp or CutMix), it does, with the same draws: one pass fewer over the
    batch."""

    def __init__(self, fn: Callable, normalize: Normalize):
        self.fn, self.normalize = fn, normalize

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, seed: int):
        n = self.normalize
        # folded per batch, not once: a change to the user's transform shows at the next one
        folded = _ask(self.fn, "fold_normalization", n.scale, n.shift)
        fn = self.fn if folded is None else folded
        given = images
        images, labels = call(fn, images, labels, batch_generator(seed, images.device))
        _check_batch(images, given)
        return n(images, values=folded is None), labels


def _check_batch(images: torch.Tensor, given: torch.Tensor) -> None:
    """What the loader needs of a batch transform's images: the batch's size, 3 channels,
    floats, on the batch's device (the height and width are the transform's choice)."""
    if (images.dim() != 4 or images.shape[:2] != given.shape[:2] or
            not images.is_floating_point() or images.device != given.device):
        raise ValueError(f"batch_transform returned images of shape {tuple(images.shape)}, "
                         f"{images.dtype}, on {images.device}; it must return float images of "
                         f"shape ({len(given)}, 3, H, W) on {given.device}, as it was given")
