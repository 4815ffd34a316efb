"""Worker-side image preparation: open → fix orientation/mode → fit to squares → encode.

Runs in worker processes; pure functions of (path, options), so output is deterministic.
"""
from __future__ import annotations

import io
import math
import mmap
import os
import stat
import struct
import warnings
from dataclasses import dataclass

import numpy as np
import simplejpeg
from PIL import Image, ImageOps, UnidentifiedImageError
from PIL import features as PIL_features

from fastdata import kernels
from fastdata.format import BACKGROUND, PAGE, crc32


def unknown_format(data) -> str:
    """Why PIL could not open ``data``: a WebP file where this PIL was built without WebP
    (pillow-simd compiles it only where libwebp's headers are found) says so."""
    head = bytes(data[:12])
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP" and not PIL_features.check("webp"):
        return ("a WebP image, and this PIL was built without WebP support: install libwebp's "
                "headers (e.g. apt-get install libwebp-dev), then rebuild pillow-simd "
                "(./install.sh)")
    return "not an image format PIL can read"


def _native_pack():
    """The C kernels' ``pack_rgb``, where they were built (no torch in them), else None."""
    native = kernels.native()
    return None if native is None else native.pack_rgb

_RESAMPLE = Image.Resampling.BICUBIC
_EXIF_ORIENTATION = 0x0112
FAST_UPSAMPLE_SHRINK = 1.4      # see _decode_jpeg
_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,   # as in
              4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,     # ImageOps.
              6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,         # exif_
              8: Image.Transpose.ROTATE_90}                                         # transpose


@dataclass(frozen=True)
class Span:
    """Bytes of a local file that a decode worker reads itself: ``size`` bytes from
    ``offset`` (a tar's member, an image in a memory-mapped Arrow file)."""

    path: str
    offset: int
    size: int


@dataclass(frozen=True)
class Unreadable:
    """An image known to be missing before it is decoded (a null cell): skipped with
    ``reason``."""

    reason: str


@dataclass(frozen=True)
class DecodeOptions:
    sizes: tuple[int, ...]          # ascending
    fit: str = "crop"
    encoding: str = "raw"
    quality: int = 90


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode → 8-bit RGB; alpha is composited onto ``BACKGROUND``, 16-bit is scaled."""
    if img.mode == "RGB":
        return img
    if img.mode in ("I", "F") or img.mode.startswith("I;16"):
        a = np.asarray(img).astype(np.float64)
        if img.mode.startswith("I;16") or (img.mode == "I" and a.max(initial=0) > 255):
            hi = 65535.0
        else:
            hi = 1.0 if (img.mode == "F" and a.max(initial=0) <= 1.0) else 255.0
        a = np.clip(a * (255.0 / hi) + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(a, "L").convert("RGB")
    has_alpha = img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        img.mode == "P" and "transparency" in img.info)
    if has_alpha:
        rgba = img.convert("RGBA")
        bg = Image.new("RGB", rgba.size, BACKGROUND)
        bg.paste(rgba, mask=rgba.getchannel("A"))
        return bg
    return img.convert("RGB")


def _draft_request(w: int, h: int, size: int, fit: str) -> tuple[int, int]:
    """Smallest decoded (w, h) that still leaves every needed side >= size."""
    if fit == "crop":
        k = size / min(w, h)
    elif fit == "pad":
        k = size / max(w, h)
    else:   # stretch: each side independently
        return min(w, size), min(h, size)
    return math.ceil(w * k), math.ceil(h * k)


def fit_square(img: Image.Image, size: int, fit: str) -> Image.Image:
    w, h = img.size
    if fit == "stretch":
        return img.resize((size, size), _RESAMPLE)
    if fit == "crop":
        s = min(w, h)
        x, y = (w - s) / 2, (h - s) / 2
        return img.resize((size, size), _RESAMPLE, box=(x, y, x + s, y + s))
    k = size / max(w, h)    # pad: fit the longer side, centre on the background
    nw, nh = max(1, round(w * k)), max(1, round(h * k))
    out = Image.new("RGB", (size, size), BACKGROUND)
    out.paste(img.resize((nw, nh), _RESAMPLE), ((size - nw) // 2, (size - nh) // 2))
    return out


def encode(img: Image.Image, opts: DecodeOptions) -> bytes:
    """RGB or RGBX pixels → the stored payload (packed RGB, or a JPEG of them)."""
    if opts.encoding == "raw":
        return _packed_rgb(img)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=opts.quality)
    return buf.getvalue()


def _exif_orientation(data: bytes) -> int | None:
    """The EXIF orientation of JPEG ``data`` as PIL's ``getexif()`` reads it (its first
    ``Exif`` APP1 segment before the scan), 1 when it has none; ``None`` when the markers or
    the Exif block are laid out in a way this does not read (PIL then decides)."""
    i = 2
    try:
        while True:
            if data[i] != 0xFF:
                return None
            marker = data[i + 1]
            if marker == 0xFF:      # fill byte
                i += 1
                continue
            if marker == 0xDA:      # start of scan: no Exif before it
                return 1
            if marker == 0x01 or 0xD0 <= marker <= 0xD9:
                return None         # standalone markers do not belong here
            length = int.from_bytes(data[i + 2:i + 4], "big")
            if marker == 0xE1 and data[i + 4:i + 10] == b"Exif\0\0":
                return _tiff_orientation(data[i + 10:i + 2 + length])
            i += 2 + length
    except (IndexError, struct.error):
        return None


def _tiff_orientation(tiff: bytes) -> int | None:
    e = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if e is None:
        return None
    magic, ifd = struct.unpack_from(e + "HI", tiff, 2)
    if magic != 42:
        return None
    for k in range(struct.unpack_from(e + "H", tiff, ifd)[0]):
        tag, kind, count = struct.unpack_from(e + "HHI", tiff, ifd + 2 + 12 * k)
        if tag == _EXIF_ORIENTATION:
            return (struct.unpack_from(e + "H", tiff, ifd + 10 + 12 * k)[0]
                    if kind == 3 and count == 1 else None)
    return 1


def _packed_rgb(img: Image.Image) -> bytes:
    """``img.tobytes("raw", "RGB")`` in one piece: ``tobytes`` packs 64 KiB at a time and
    joins the pieces, a copy more."""
    n = 3 * img.width * img.height
    try:
        encoder = Image._getencoder(img.mode, "raw", ("RGB", 0, 1))
        encoder.setimage(img.im)
        _, done, data = encoder.encode(n + 1)
        if done > 0 and len(data) == n:
            return data
    except Exception:   # noqa: BLE001 - a private API: any change of it (Pillow 13 raises
        pass            # TypeError here) falls back to the public way
    return img.tobytes("raw", "RGB")


class Scratch:
    """A worker's decode buffer, used image after image, so that it stays in the CPU's caches
    (a fresh array each time lands wherever the allocator puts it). What ``take`` returns is
    valid until the next ``take``."""

    def __init__(self):
        self._buf = np.empty(0, np.uint8)

    def take(self, nbytes: int) -> np.ndarray:
        if self._buf.size < nbytes:
            self._buf = np.empty(nbytes, np.uint8)
        return self._buf[:nbytes]


def _decode_jpeg(data: bytes, opts: DecodeOptions,
                 scratch: Scratch | None = None) -> Image.Image | None:
    """Upright RGBX pixels of JPEG ``data``, from libjpeg-turbo through simplejpeg, that PIL
    then uses without a copy; ``None`` for what this does not take (not a JPEG, CMYK, an Exif
    block it does not read, anything libjpeg-turbo warns about), so PIL decides those.

    The same library, IDCT and power-of-two DCT scaling as PIL's ``Image.draft``, so the same
    pixels, except that an image shrunk by ``FAST_UPSAMPLE_SHRINK`` or more after decoding gets
    libjpeg-turbo's fast chroma upsampling: there it is as close to the pixels before JPEG
    coding as the default's, and the decode takes a tenth less time. Not through PIL, which
    decodes into its own buffer and repacks. The header and the Exif orientation are read here
    too, not by ``Image.open``, which parses the markers in Python.
    With ``scratch``, the pixels are decoded into it (the image is a view of it).
    """
    if data[:3] != b"\xff\xd8\xff":
        return None
    try:
        h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    orientation = _exif_orientation(data)
    if (colorspace not in ("YCbCr", "Gray", "RGB") or orientation is None
            or w * h > 2 * (Image.MAX_IMAGE_PIXELS or w * h)):  # PIL refuses a bomb
        return None
    need_w, need_h = _draft_request(w, h, opts.sizes[-1], opts.fit)
    most = min(w // need_w, h // need_h)    # Image.draft's rule, so both paths agree
    k = next((s for s in (8, 4, 2) if most >= s), 1)
    fast = min(w / need_w, h / need_h) / k >= FAST_UPSAMPLE_SHRINK
    ow, oh = -(-w // k), -(-h // k)
    try:
        a = simplejpeg.decode_jpeg(data, colorspace="RGBX", min_width=ow, min_height=oh,
                                   fastupsample=fast,
                                   buffer=None if scratch is None else scratch.take(4 * ow * oh))
    except ValueError:
        return None
    out = Image.frombuffer("RGBX", (a.shape[1], a.shape[0]), a, "raw", "RGBX", 0, 1)
    method = _TRANSPOSE.get(orientation)
    return out.transpose(method) if method is not None else out


#: larger files are not read: PIL refuses images above twice ``Image.MAX_IMAGE_PIXELS`` (89 M)
#: pixels anyway, and the largest such image in an uncompressed format is ~0.7 GiB
MAX_FILE_BYTES = 1 << 30
#: the first bytes of each format the converter takes (TIFF: classic and BigTIFF)
_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"II*\0",
          b"MM\0*", b"II+\0", b"MM\0+")


def _read(path: str) -> bytes:
    """The file's bytes, as ``open(path, "rb").read()`` gives them without its buffered reader
    (a copy less), once its first bytes show an image format and its
    size is one an image can have: nothing else is loaded. A FIFO or a device is refused
    before it is read (opened without blocking)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ValueError(f"file too large ({st.st_size / 2**30:.1f} GiB; images of up to "
                             f"{MAX_FILE_BYTES >> 30} GiB are read)")
        _checked(os.pread(fd, 12, 0))
        parts = [os.read(fd, st.st_size + 1)]
        while parts[-1] and sum(map(len, parts)) <= MAX_FILE_BYTES:    # a file that grew since
            parts.append(os.read(fd, 1 << 20))
    finally:
        os.close(fd)
    return parts[0] if len(parts) == 2 else b"".join(parts)


def _checked(data: bytes) -> bytes:
    """``data``, refused where its first bytes show no image format the converter reads."""
    head = data[:12]
    if head and not (head.startswith(_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")):
        # the bytes themselves are not repeated: a link may reach any readable file
        raise ValueError("not an image: its first bytes match no image format the "
                         "converter reads")
    return data


def _span(span: Span) -> bytes:
    """A span's bytes (a tar's member, an Arrow cell), read as ``_read`` reads a file."""
    if span.size > MAX_FILE_BYTES:
        raise ValueError(f"too large ({span.size / 2**30:.1f} GiB; images of up to "
                         f"{MAX_FILE_BYTES >> 30} GiB are read)")
    fd = os.open(span.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        if not _checked(os.pread(fd, 12, span.offset)) and span.size:
            raise ValueError(f"{span.path} ends before byte {span.offset}")
        data = os.pread(fd, span.size, span.offset)
    finally:
        os.close(fd)
    if len(data) < span.size:
        raise ValueError(f"cut short: {len(data)} of its {span.size} bytes are in "
                         f"{os.path.basename(span.path)}")
    return data


def bytes_of(item) -> bytes:
    """The encoded image a decode worker is handed: a file's path, a ``Span`` of a file, the
    bytes themselves or an ``Unreadable`` (refused with its reason).

    Raises:
        ValueError: why there is no image there.
        OSError: the file cannot be read.
    """
    if isinstance(item, str):
        return _read(item)
    if isinstance(item, Span):
        return _span(item)
    if isinstance(item, Unreadable):
        raise ValueError(item.reason)
    return _checked(bytes(item))


def _load(item, opts: DecodeOptions, scratch: Scratch | None = None) -> Image.Image:
    """Decoded, upright pixels of ``item`` (``bytes_of``: RGB or RGBX), perhaps a view of
    ``scratch``. Raises on unreadable input."""
    data = bytes_of(item)
    if not data:
        raise ValueError("empty file (0 bytes)")
    fast = _decode_jpeg(data, opts, scratch)
    if fast is not None:
        return fast
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # EXIF/metadata chatter; real damage still raises
        try:
            img = Image.open(io.BytesIO(data))
        except UnidentifiedImageError:      # its message names a BytesIO's address
            raise UnidentifiedImageError(unknown_format(data)) from None
        with img:
            if img.format == "JPEG":
                img.draft("RGB", _draft_request(*img.size, opts.sizes[-1], opts.fit))
            # loads the pixels: truncation raises here
            img = ImageOps.exif_transpose(img)  # type: ignore[assignment]
            return to_rgb(img)


def pack_into(img: Image.Image, out: np.ndarray) -> None:
    """``img``'s pixels as packed RGB into ``out`` (uint8, 3 bytes a pixel): through fastdata's C
    kernel from Pillow's Arrow export (no copy of the image), else through Pillow's packing and
    a copy."""
    pack = _native_pack()
    if pack is not None and img.mode in ("RGB", "RGBX"):
        try:
            pack(*img.__arrow_c_array__(), out)
            return
        except (AttributeError, ValueError):    # Pillow < 11.2; an image in several blocks
            pass
    out[:] = np.frombuffer(_packed_rgb(img), np.uint8)


def prepare(path, opts: DecodeOptions, out: list[np.ndarray] | None = None,
            scratch: Scratch | None = None, shape: list | None = None) -> list:
    """Payloads for ``path`` (a file, or any item ``bytes_of`` takes), one per size
    (ascending). With ``out`` (raw encoding: an array per size), the pixels are packed into
    those, which are returned. ``scratch``: where to decode; ``shape``: a list that the
    decoded picture's ``(width, height)`` is appended to, as the fit placed it (the frame of
    fields given over the whole picture). Raises on unreadable input."""
    img = _load(path, opts, scratch)
    if shape is not None:
        shape.append(img.size)
    largest = fit_square(img, opts.sizes[-1], opts.fit)
    squares = [largest] + [largest.resize((s, s), _RESAMPLE) for s in opts.sizes[-2::-1]]
    if out is None:
        return [encode(sq, opts) for sq in reversed(squares)]
    for sq, dst in zip(reversed(squares), out):
        pack_into(sq, dst)
    return out


class Ring:
    """Shared anonymous memory that forked workers inherit: raw payloads come back through it,
    one slot per image position, instead of being pickled through a pipe and unpickled.

    A slot is ``position % slots``; the parent keeps at most ``slots`` images in flight and
    reads a slot before it hands that slot's next position to a worker. Each payload starts on
    a page boundary, so that the writer can hand it to ``O_DIRECT`` writes as it is.
    """

    def __init__(self, slots: int, sizes: tuple[int, ...]):
        self.slots = slots
        self.lengths = [3 * s * s for s in sizes]
        self.offsets = np.cumsum([0] + [-(-n // PAGE) * PAGE for n in self.lengths]).tolist()
        self.mem = np.frombuffer(mmap.mmap(-1, slots * self.offsets[-1]), np.uint8).reshape(
            slots, self.offsets[-1])

    def get(self, pos: int) -> list[np.ndarray]:
        row = self.mem[pos % self.slots]
        return [row[a:a + n] for a, n in zip(self.offsets, self.lengths)]


@dataclass(frozen=True)
class Held:
    """An encoded image the parent put in the ``Inbox``: ``size`` bytes at ``offset``."""

    offset: int
    size: int


class Inbox:
    """Shared anonymous memory that forked workers inherit: the encoded images the parent
    reads itself (a parquet cell, a tar's member in a store) reach the workers through it, a
    region of ``batch_bytes`` per batch in flight, instead of through a pipe, whose write
    blocks the parent (and its writes of the shards) until a busy worker reads the batch.

    Batch ``number``'s region is ``number % batches``: the decoder keeps at most ``batches``
    batches in flight, so a region is free again once its batch's results are in. An image
    that does not fit its batch's region goes through the pipe as it is.
    """

    def __init__(self, batches: int, batch_bytes: int):
        self.batches, self.batch_bytes = batches, batch_bytes
        self.mem = mmap.mmap(-1, batches * batch_bytes)

    def put(self, number: int, batch: list[tuple]) -> list[tuple]:
        """``batch`` (``[(position, item)]``) with its bytes copied into batch ``number``'s
        region, a ``Held`` in their place (bytes that do not fit, as ``bytes``)."""
        base, at, out = (number % self.batches) * self.batch_bytes, 0, []
        for pos, item in batch:
            if isinstance(item, (bytes, bytearray, memoryview)):
                n = len(item)
                if at + n <= self.batch_bytes:
                    self.mem[base + at:base + at + n] = item
                    item, at = Held(base + at, n), at + n
                else:
                    item = bytes(item)
            out.append((pos, item))
        return out

    def get(self, held: Held) -> bytes:
        return self.mem[held.offset:held.offset + held.size]


def prepare_batch(jobs: list[tuple], opts: DecodeOptions, ring: Ring | None = None,
                  scratch: Scratch | None = None, on_item=None,
                  inbox: Inbox | None = None) -> list[tuple]:
    """Worker entry: ``[(position, item)]`` (an item: what ``bytes_of`` takes, or a ``Held``
    in the ``inbox``) → ``[(position, payloads, crc32s, error, (width, height) of the
    picture)]``.

    With a ``ring``, payloads go into it and ``None`` stands in for them; with a ``scratch``,
    the JPEGs are decoded into it; ``on_item()`` is called as each image starts.
    """
    out: list[tuple] = []
    for pos, path in jobs:
        if on_item is not None:
            on_item()
        try:
            if isinstance(path, Held):
                path = inbox.get(path)  # type: ignore[union-attr]
            shape: list = []
            payloads = prepare(path, opts, None if ring is None else ring.get(pos), scratch,
                               shape)
            crcs = [crc32(p) for p in payloads]
        except Exception as e:      # noqa: BLE001 - any failure is a skipped input, reported
            out.append((pos, None, None, f"{type(e).__name__}: {e}", None))
            continue
        out.append((pos, None if ring is not None else payloads, crcs, None, shape[0]))
    return out
