"""Folders of images with spatial labels: COCO annotations (``--coco FILE``, ``--source
coco``: boxes, instance masks, person keypoints; ``fastdata.converters.coco``) and PNG class
maps (``--masks DIR``, ``--source masks``; ``fastdata.converters.masks``)."""
from __future__ import annotations

import os

from fastdata.converters.coco import scan_coco
from fastdata.converters.masks import scan_masks
from fastdata.converters.scan import Scan
from fastdata.converters.sources.base import Source, register
from fastdata.converters.units import ConversionError


class _Annotated(Source):
    """Images under ``src`` that an annotations file or folder (the one option ``takes``
    names) labels."""

    def scan(self, *, progress: bool) -> Scan:
        name = self.takes[0]
        if self.options[name] is None:
            raise ValueError(f"a {self.kind} source needs --{name}")
        what = os.path.abspath(str(self.options[name]))
        read = scan_coco if self.kind == "coco" else scan_masks
        scan = read(self.src, what, workers=self.workers, progress=progress)
        if not scan.files:
            raise ConversionError(f"none of the images under {self.src!r} has its labels in "
                                  f"{what} ({len(scan.skipped)} left out, e.g. "
                                  f"{scan.skipped[:1]})")
        return scan


@register
class CocoSource(_Annotated):
    """A detection set: the images a COCO file lists, with boxes, masks and keypoints."""

    kind = "coco"
    takes = ("coco",)
    described = "a folder of images with COCO annotations (--coco FILE.json)"


@register
class MasksSource(_Annotated):
    """A segmentation set: the images with a PNG class map in the ``masks`` folder."""

    kind = "masks"
    takes = ("masks",)
    described = "a folder of images with PNG class maps (--masks DIR)"
