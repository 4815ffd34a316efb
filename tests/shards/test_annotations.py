"""The annotations file's records: masks and class maps round-trip through their runs, and a
record whose header lies is refused before anything is allocated or viewed."""
from __future__ import annotations

import io

import numpy as np
import pytest

from fastdata.fields.classmap import encode_runs
from fastdata.format import ShardFormatError
from fastdata.shards.annotations import Annotations, _Records
from tests.helpers import encode_masks, write_annotations


def test_masks_and_class_maps_round_trip_through_their_runs(tmp_path):
    rng = np.random.default_rng(0)
    masks = (rng.random((5, 16, 16)) < 0.4).astype(np.uint8)
    masks[0] = 1                                # starts inside: an empty first run
    masks[1] = 0
    entry = write_annotations(str(tmp_path / "annotations.bin"), [0, 5],
                              np.tile([0.1, 0.1, 0.9, 0.9], (5, 1)), [0] * 5, [0] * 5,
                              {16: encode_masks(masks)})
    ann = Annotations(str(tmp_path), entry, num_samples=1, num_classes=1, sizes=(16,))
    assert np.array_equal(ann.masks(0, 16), masks)
    cmap = rng.integers(0, 4, (16, 16)).astype(np.uint8)
    cmap[3:9] = 255
    runs, values = encode_runs(cmap)
    assert np.array_equal(np.repeat(values, runs).reshape(16, 16), cmap)


@pytest.mark.parametrize("shape, dtype, ndim", [
    ((2 ** 62, 4), "<i8", 2),                   # its size wraps a 64-bit product
    ((1000,), "<i8", 1),                        # more than the bytes left
    ((3,), "<f8", 1),                           # another dtype
    ((3,), "|O", 1),                            # objects: never unpickled
])
def test_a_record_whose_header_lies_is_refused(shape, dtype, ndim):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False,
                                               "shape": shape})
    buf.write(np.zeros(3, np.int64).tobytes())
    with pytest.raises(ShardFormatError, match="damaged"):
        _Records(buf.getvalue(), "a.bin").take("offsets", np.int64, ndim)
