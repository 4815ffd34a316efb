"""The C image kernels' Python side (``_native.c``, built at install where a C compiler is
found): each function checks every pointer, shape and box it hands to C.

``crop_resize``: crop + antialiased bilinear resize + flip + normalise in one pass, uint8 HWC →
float32, bfloat16 or uint8, the CPU default of the crop stage for those outputs
(``CropStage(kernel="auto")``);
``color_jitter``: ``transforms.ColorJitter``'s adjustments; ``affine``: a per-channel
``x * scale + shift``, the loader's normalisation after a batch transform; ``fill_outlines``:
instance masks drawn from their outlines; ``sample_runs``: class maps sampled straight from
their runs. Where the extension
was not built, torch ops do the same work, more slowly (``docs/performance.md``).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fastdata import kernels


def available() -> bool:
    """Whether the C kernel was built and imports."""
    return kernels.native() is not None


#: the output element types the crop kernel writes, and their codes in C
OUT_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.uint8: 2}


def fits(images: torch.Tensor) -> bool:
    """Whether the kernels take ``images`` as they are: float32 on the CPU, and built."""
    return images.device.type == "cpu" and images.dtype == torch.float32 and available()


def require() -> None:
    if not available():
        raise ImportError("fastdata's C kernel (fastdata.kernels._native) is not built: reinstall "
                          "fastdata where a C compiler is found (e.g. `apt-get install gcc`, "
                          "then `./install.sh`), or use kernel='per_sample'")


def crop_resize(images: Sequence[torch.Tensor], params, out: torch.Tensor, scale,
                shift) -> torch.Tensor:
    """``out[k] = scale * resize(crop(images[k])) + shift`` per channel, as
    ``ops.crop.crop_resize_batched`` computes it, for every ``k``.

    images: B uint8 (H, W, 3) CPU tensors with packed pixels (strides (row, 3, 1); rows may be
    further apart, e.g. views of a larger array), or one (B, H, W, 3) tensor; params: (B, 5)
    integers ``[top, left, h, w, flip]``, a CPU tensor (``ops.boxes.packed_params``) or an
    array; out: a float32, bfloat16 or uint8 (B, 3, O, O) CPU tensor, any strides (the values
    computed in float32, rounded once as they are stored); scale, shift: 3 values each, a CPU
    tensor or a sequence (for uint8 output 1 and 0: the resized pixels as they are, which the
    resize's weights, >= 0 and summing to 1, keep in 0..255). The GIL is released while it
    runs. Every pointer handed to C is checked here first."""
    require()
    n = len(images)
    if out.dtype not in OUT_TYPES or out.device.type != "cpu" or out.dim() != 4 \
            or out.shape[0] != n or out.shape[1] != 3 or out.shape[2] != out.shape[3] \
            or out.shape[2] < 1:
        raise ValueError(f"out must be a float32, bfloat16 or uint8 CPU tensor of shape ({n}, "
                         f"3, O, O), O >= 1, not {out.dtype} {tuple(out.shape)} on "
                         f"{out.device}")
    # the checks in NumPy: each small torch op would release and retake the GIL, a thread
    # switch where reader threads share it
    p = np.ascontiguousarray(params.numpy() if isinstance(params, torch.Tensor) else params,
                             dtype=np.int64)
    if p.shape != (n, 5):
        raise ValueError(f"params must be ({n}, 5) [top, left, h, w, flip], not {p.shape}")
    meta = _image_table(images)
    _check_boxes(p, meta[:, 5:7])
    scale, shift = (np.ascontiguousarray(v.numpy() if isinstance(v, torch.Tensor) else v,
                                         dtype=np.float32).reshape(3) for v in (scale, shift))
    if out.dtype == torch.uint8 and not ((scale == 1).all() and (shift == 0).all()):
        raise ValueError(f"uint8 output takes the pixels as they are: scale (1, 1, 1) and shift "
                         f"(0, 0, 0), not {scale.tolist()} and {shift.tolist()}")
    ptrs, strides = np.ascontiguousarray(meta[:, 1]), np.ascontiguousarray(meta[:, 2])
    kernels.native().crop_resize(n, ptrs.ctypes.data, strides.ctypes.data, p.ctypes.data,
                                 out.shape[2], out.data_ptr(), OUT_TYPES[out.dtype],
                                 *out.stride(), scale.ctypes.data, shift.ctypes.data)
    return out


def _image_table(images) -> np.ndarray:
    """Per image: whether it is a uint8 CPU (H, W, 3) tensor, its address, 3 strides and 3
    sizes, as one (B, 8) array (fewer Python steps per image than a check of each image).

    Raises:
        ValueError: an image of another kind, or without packed RGB pixels (named).
    """
    rows = [(img.dtype is torch.uint8 and img.device.type == "cpu", img.data_ptr(),
             *img.stride(), *img.shape) if img.dim() == 3 else (False,) * 8 for img in images]
    meta = np.array(rows, dtype=np.int64).reshape(len(images), 8)
    if not meta[:, 0].all():
        k = int(np.flatnonzero(meta[:, 0] == 0)[0])
        raise ValueError(f"images must be uint8 CPU (H, W, 3) tensors, not {images[k].dtype} "
                         f"{tuple(images[k].shape)} on {images[k].device} (image {k})")
    packed = (meta[:, 3] == 3) & (meta[:, 4] == 1) & (meta[:, 7] == 3) \
        & (meta[:, 2] >= 3 * meta[:, 6])
    if not packed.all():
        k = int(np.flatnonzero(~packed)[0])
        raise ValueError(f"image {k} must have packed RGB pixels (strides (row, 3, 1), 3 "
                         f"channels), not shape {tuple(images[k].shape)} strides "
                         f"{images[k].stride()}")
    return meta


def _check_boxes(params: np.ndarray, sizes: np.ndarray) -> None:
    """Raises ValueError naming the first box not inside its image's ``(h, w)``."""
    top, left, h, w = params[:, :4].T
    bad = (top < 0) | (left < 0) | (h < 1) | (w < 1) | (top + h > sizes[:, 0]) \
        | (left + w > sizes[:, 1])
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValueError(f"box {params[k, :4].tolist()} of image {k} is not inside its "
                         f"{tuple(sizes[k].tolist())} pixels")


def color_jitter(images: torch.Tensor, factors: torch.Tensor, order: Sequence[int],
                 scale: Sequence[float] | None = None,
                 shift: Sequence[float] | None = None) -> None:
    """``transforms.ColorJitter``'s adjustments, in place: ``images`` a float32 (B, 3, H, W)
    CPU tensor (any strides), ``factors`` (B, 4) brightness, contrast, saturation and hue per
    image, ``order`` the adjustments to apply (0-3 in that numbering), in order; then, with
    ``scale`` and ``shift`` (3 values each), ``x * scale + shift`` per channel in the same
    pass. The GIL is released while it runs."""
    require()
    if images.dtype != torch.float32 or images.device.type != "cpu" or images.dim() != 4 \
            or images.shape[1] != 3:
        raise ValueError(f"images must be a float32 CPU tensor of shape (B, 3, H, W), not "
                         f"{images.dtype} {tuple(images.shape)} on {images.device}")
    n, _, h, w = images.shape
    factors = factors.to(torch.float32).contiguous()
    ops = torch.as_tensor(list(order), dtype=torch.int64)
    if factors.shape != (n, 4) or len(ops) > 4 or bool(((ops < 0) | (ops > 3)).any()):
        raise ValueError(f"factors must be ({n}, 4) and order up to 4 of 0-3, not "
                         f"{tuple(factors.shape)} and {ops.tolist()}")
    pair = (scale, shift)
    if (scale is None) != (shift is None) or (scale is not None and shift is not None
                                              and (len(scale), len(shift)) != (3, 3)):
        raise ValueError(f"scale and shift must be 3 values each, or both None; not {scale!r} "
                         f"and {shift!r}")
    affine = None if None in pair else torch.tensor([*scale, *shift],  # type: ignore[misc]
                                                    dtype=torch.float32)
    ptrs = (0, 0) if affine is None else (affine.data_ptr(), affine[3:].data_ptr())
    kernels.native().color_jitter(n, images.data_ptr(), *images.stride(), h, w,
                                  factors.data_ptr(), ops.data_ptr(), len(ops), *ptrs)


def affine(images: torch.Tensor, scale: Sequence[float], shift: Sequence[float]) -> None:
    """``images * scale + shift`` per channel, in place, in one pass: ``color_jitter`` with no
    adjustment (a loader's normalisation on the CPU: faster than torch's broadcast multiply-add)."""
    color_jitter(images, torch.zeros(len(images), 4), [], scale, shift)


def fill_outlines(xy: np.ndarray, starts: np.ndarray, owner: np.ndarray,
                  masks: np.ndarray) -> None:
    """Outlines drawn into ``masks`` (uint8 ``(K, S, S)``, C-contiguous), ORed in: outline
    ``k`` is the points ``xy[starts[k]:starts[k + 1]]`` (float64 ``(P, 2)``, x y in the masks'
    pixels), drawn into mask ``owner[k]``; a pixel is inside where its centre is (even-odd).
    The GIL is released while it runs. Every buffer and index is checked here first.

    Raises:
        ValueError: a buffer of the wrong type or shape, offsets that do not cut ``xy``, an
            owner out of range, or a point that is not finite.
    """
    require()
    xy = np.ascontiguousarray(xy, np.float64)
    starts = np.ascontiguousarray(starts, np.int64)
    owner = np.ascontiguousarray(owner, np.int64)
    if masks.dtype != np.uint8 or masks.ndim != 3 or masks.shape[1] != masks.shape[2] or \
            not masks.flags.c_contiguous or not masks.flags.writeable:
        raise ValueError(f"masks must be a writable C-contiguous uint8 (K, S, S) array, not "
                         f"{masks.dtype} {masks.shape}")
    n = len(owner)
    if xy.ndim != 2 or xy.shape[1] != 2 or starts.shape != (n + 1,) or starts[0] != 0 or \
            starts[-1] != len(xy) or (np.diff(starts) < 0).any() or \
            (n and (owner.min() < 0 or owner.max() >= len(masks))) or \
            not np.isfinite(xy).all():
        raise ValueError("fill_outlines: points, offsets or owners that do not fit together, "
                         "or a point that is not finite")
    if n:
        kernels.native().fill_outlines(n, xy.ctypes.data, starts.ctypes.data,
                                       owner.ctypes.data, masks.ctypes.data, masks.shape[1],
                                       int(np.diff(starts).max()))


def sample_runs(buf: np.ndarray, heads: np.ndarray, rows: np.ndarray, cols: np.ndarray,
                flips: np.ndarray, out: np.ndarray) -> None:
    """Run-length encoded maps sampled into ``out`` (uint8 ``(B, S, S)``, C-contiguous): map
    ``k``'s runs are ``heads[k] = (offset, n, w)``, ``n`` little-endian uint32 lengths at byte
    ``offset`` of ``buf`` (uint8) and then ``n`` uint8 values, covering ``h * w`` pixels row
    by row; its output pixel ``(i, j)`` is its value at row ``rows[k, i]``, column
    ``cols[k, j]`` (each non-decreasing, inside the map), the row mirrored where
    ``flips[k]``. The caller checks the runs (positive, summing to ``h * w``) and the rows and
    columns; the reads stay inside each map's runs whatever they hold (a position past them
    reads the last run), and every buffer is checked here. The GIL is released.

    Raises:
        ValueError: a buffer of the wrong type or shape, or runs past the end of ``buf``.
    """
    require()
    heads = np.ascontiguousarray(heads, np.int64).reshape(-1, 3)
    rows = np.ascontiguousarray(rows, np.int64)
    cols = np.ascontiguousarray(cols, np.int64)
    flips = np.ascontiguousarray(flips, np.uint8)
    b = len(heads)
    if buf.dtype != np.uint8 or buf.ndim != 1 or not buf.flags.c_contiguous:
        raise ValueError("sample_runs: buf must be a contiguous uint8 array")
    if out.dtype != np.uint8 or out.ndim != 3 or out.shape[0] != b or \
            out.shape[1] != out.shape[2] or not out.flags.c_contiguous or \
            not out.flags.writeable:
        raise ValueError(f"sample_runs: out must be a writable C-contiguous uint8 ({b}, S, S) "
                         f"array, not {out.dtype} {out.shape}")
    s = out.shape[1]
    offset, n, w = heads.T
    if rows.shape != (b, s) or cols.shape != (b, s) or flips.shape != (b,) or (b and (
            (n < 1).any() or (w < 1).any() or (offset < 0).any()
            or (offset + 5 * n > len(buf)).any())):
        raise ValueError("sample_runs: heads, rows, columns or flips that do not fit together")
    if b and s:
        kernels.native().sample_runs(b, buf.ctypes.data, heads.ctypes.data, rows.ctypes.data,
                                     cols.ctypes.data, flips.ctypes.data, out.ctypes.data, s)
