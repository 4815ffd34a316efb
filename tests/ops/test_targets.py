"""The targets' geometry on hand-made annotations: a box through a crop, a resize and a flip,
the rule that drops a box mostly cut away, the masks' sampling grid, and the padded form."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata.ops.targets import Targets, crop_targets, padded, sample_grid


class Boxes:
    """What ``crop_targets`` reads of ``Annotations``: one image's boxes (stored fractions)
    and, where given, its masks."""

    kind = "detection"

    def __init__(self, boxes, classes, masks=None):
        self.boxes = np.asarray(boxes, np.float32)
        self.classes = np.asarray(classes, np.int64)
        self.iscrowd = np.zeros(len(classes), np.uint8)
        self.offsets = np.array([0, len(classes)])
        self.has_masks = masks is not None
        self._masks = masks

    def counts(self, indices):
        return self.offsets[np.asarray(indices) + 1] - self.offsets[np.asarray(indices)]

    def rows(self, indices):
        return np.arange(len(self.boxes)) if len(indices) else np.zeros(0, np.int64)

    def masks(self, index, size):
        return self._masks


def test_a_box_through_a_crop_resize_and_flip():
    # stored 100 px; a box from (20, 30) to (60, 50); crop top 10, left 10, 50 x 50 → 100 px
    ann = Boxes([[0.2, 0.3, 0.6, 0.5]], [4])
    crop = torch.tensor([[10, 10, 50, 50]])
    (t,) = crop_targets(ann, [0], crop, [False], 100, 100)
    assert torch.allclose(t["boxes"], torch.tensor([[20.0, 40.0, 100.0, 80.0]]))
    assert t["labels"].tolist() == [5]          # class index + 1
    (f,) = crop_targets(ann, [0], crop, [True], 100, 100)
    assert torch.allclose(f["boxes"], torch.tensor([[0.0, 40.0, 80.0, 80.0]]))


def test_which_boxes_a_crop_keeps():
    """20 x 20 stored px at the crop's edge (100 px stored, a 50 px crop to 50 px): by default
    any part of at least a pixel is kept, as torchvision's SanitizeBoundingBoxes keeps it; a
    minimum visible fraction or output size drops what it cuts below it."""
    box = Boxes([[0.0, 0.0, 0.2, 0.2]], [0])

    def edge(left, rule=None):
        return crop_targets(box, [0], torch.tensor([[0, left, 50, 50]]), [False], 100, 50,
                            rule or Targets())[0]["boxes"]
    assert torch.allclose(edge(17), torch.tensor([[0.0, 0.0, 3.0, 20.0]]))    # 15% inside
    assert torch.allclose(edge(19), torch.tensor([[0.0, 0.0, 1.0, 20.0]]))    # 5%, 1 px
    assert len(edge(20)) == 0                                    # nothing inside
    assert len(edge(19, Targets(min_visible=0.1))) == 0
    assert len(edge(17, Targets(min_visible=0.1))) == 1
    assert len(edge(17, Targets(min_size=4))) == 0 and len(edge(16, Targets(min_size=4))) == 1
    assert len(edge(19, Targets(min_size=0))) == 1


@pytest.mark.parametrize("bad, match", [({"form": "dict"}, "form 'dict' is not valid"),
                                        ({"min_visible": 1.5}, r"min_visible=1.5 .* \[0, 1\]"),
                                        ({"min_size": -1}, "min_size=-1 is not valid")])
def test_a_bad_rule_is_named(bad, match):
    with pytest.raises(ValueError, match=match):
        Targets(**bad)


def test_masks_are_sampled_at_the_resizes_pixel_centres():
    rows, cols = sample_grid((10, 20, 8, 16), 4)       # 8 rows → 4: every second one
    assert rows.tolist() == [11, 13, 15, 17] and cols.tolist() == [22, 26, 30, 34]
    rows, _ = sample_grid((0, 0, 2, 2), 4)              # upsampled: each row twice
    assert rows.tolist() == [0, 0, 1, 1]
    m = np.zeros((1, 8, 8), np.uint8)
    m[0, :, :2] = 1                                     # the two left columns
    ann = Boxes([[0.0, 0.0, 0.25, 1.0]], [0], masks=m)
    (t,) = crop_targets(ann, [0], torch.tensor([[0, 0, 8, 8]]), [True], 8, 4)
    assert t["masks"][0].tolist() == [[0, 0, 0, 1]] * 4     # flipped: on the right


def test_padded_targets_hold_each_images_boxes_and_their_count():
    a = {"boxes": torch.ones(2, 4), "labels": torch.tensor([1, 2]),
         "iscrowd": torch.zeros(2, dtype=torch.int64)}
    b = {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64),
         "iscrowd": torch.zeros(0, dtype=torch.int64)}
    p = padded([a, b], 8)
    assert p["counts"].tolist() == [2, 0] and p["boxes"].shape == (2, 2, 4)
    assert p["labels"].tolist() == [[1, 2], [-1, -1]] and "masks" not in p
