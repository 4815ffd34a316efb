"""The JPEG region decoder (libjpeg-turbo, ``_jpeg.c``): a crop's pixels as a whole decode's,
whatever the box and the chroma subsampling, records it refuses decoded whole, and a loader's
batches the same with it and without it."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.converters.convert import convert
from fastdata.kernels import jpeg
from fastdata.loader.decode import decode_regions
from fastdata.ops.boxes import random_resized_crop_boxes
from fastdata.shards.jpeg import decode_jpeg
from tests.helpers import noise, plain_folder, smooth

needs_decoder = pytest.mark.skipif(not jpeg.available(),
                                   reason="fastdata.kernels._jpeg not built")


def test_the_decoder_is_built_where_libjpeg_turbo_is():
    """Optional at install (no headers: whole decodes), so a broken build would pass
    unnoticed: where libjpeg-turbo's headers are, it must be there."""
    header = "/usr/include/jpeglib.h"
    if not os.path.exists(header) or "jpeg_crop_scanline" not in open(header).read():
        pytest.skip("no libjpeg-turbo headers here")
    assert jpeg.available()


def _record(seed: int, subsampling: int, size: int = 64) -> bytes:
    image = Image.blend(noise(size, size, seed), smooth(size, size, seed), 0.7)
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90, subsampling=subsampling)
    return buf.getvalue()


@needs_decoder
@pytest.mark.parametrize("subsampling", [0, 1, 2], ids=["4:4:4", "4:2:2", "4:2:0"])
def test_a_region_holds_a_whole_decodes_pixels(subsampling):
    payloads = [_record(k, subsampling) for k in range(40)]
    g = torch.Generator().manual_seed(subsampling)
    boxes = torch.cat([random_resized_crop_boxes(34, 64, 64, generator=g),
                       torch.tensor([[0, 0, 64, 64], [0, 0, 1, 1], [63, 63, 1, 1],
                                     [10, 0, 5, 64], [0, 31, 64, 2], [17, 9, 30, 16]])])
    out = torch.zeros((40, 64, 64, 3), dtype=torch.uint8)
    views, within = decode_regions(payloads, boxes, out, lambda k: pytest.fail(f"record {k}"))
    full = np.empty((64, 64, 3), np.uint8)
    for k, payload in enumerate(payloads):
        decode_jpeg(payload, full)
        top, left, h, w = boxes[k].tolist()
        wt, wl = within[k].tolist()[:2]
        assert views[k].shape[0] == h and views[k].shape[1] >= wl + w
        np.testing.assert_array_equal(views[k].numpy()[wt:wt + h, wl:wl + w],
                                      full[top:top + h, left:left + w])


@needs_decoder
def test_records_it_refuses_are_decoded_whole():
    good = _record(1, 2)
    payloads = [good, b"\0" * 100, _record(2, 2, size=32)]      # damaged; another size
    boxes = torch.tensor([[4, 4, 20, 20]] * 3)
    out = torch.zeros((3, 64, 64, 3), dtype=torch.uint8)
    whole = []
    views, within = decode_regions(payloads, boxes, out, whole.append)
    assert whole == [1, 2]
    assert views[1].shape == views[2].shape == (64, 64, 3)
    assert within[1].tolist() == within[2].tolist() == [4, 4, 20, 20]
    with pytest.raises(ValueError, match="out must be a contiguous uint8"):
        jpeg.decode_regions([good], [(0, 0, 8, 8)], torch.zeros((1, 64, 64, 3)))
    assert jpeg.decode_regions([good, good], [(60, 0, 8, 8), (0, 0, 8, 8)], torch.zeros(
        (2, 64, 64, 3), dtype=torch.uint8)) == [None, (0, 9)]      # outside; 8 and a column
    # values past 32 bits, or whose sums would wrap, are outside too (not narrowed first)
    huge = [(2 ** 32, 0, 8, 8), (0, 0, 2 ** 32 + 8, 8), (2 ** 62, 0, 2 ** 62, 8), (0, -1, 8, 8)]
    assert jpeg.decode_regions([good] * 4, huge, torch.zeros(
        (4, 64, 64, 3), dtype=torch.uint8)) == [None] * 4


@needs_decoder
@pytest.mark.parametrize("workers", ["thread", "process"])
def test_a_loader_gives_the_same_batches_with_and_without_it(tmp_path, monkeypatch, workers):
    out = str(tmp_path / "jpeg")
    convert(plain_folder(tmp_path / "src", per_class=8, size=(70, 50)), out, sizes=[32],
            encoding="jpeg", shard_size=5, num_workers=1, progress=False)

    def batches():
        loader = fastdata.Loader(out, batch_size=6, crop=24, device="cpu",
                                 backend=fastdata.TorchBackend(num_workers=2, workers=workers),
                                 seed=3)
        return [(x.clone(), y.clone()) for e in range(2) if not loader.set_epoch(e)
                for x, y in loader]
    calls = []
    real = jpeg.decode_regions
    monkeypatch.setattr(jpeg, "decode_regions", lambda *a: calls.append(1) or real(*a))
    with_regions = batches()
    assert calls or workers == "process"        # (a forked worker's calls are its own)
    monkeypatch.setattr(jpeg, "available", lambda: False)
    whole = batches()
    assert len(with_regions) == len(whole) == 8
    for (a, y), (b, z) in zip(with_regions, whole):
        assert torch.equal(y, z) and torch.equal(a, b)
