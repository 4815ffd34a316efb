"""A folder of images in any layout with a labels file (``--labels FILE``, ``--source
labels``): CSV, JSON Lines or parquet, a row per image (``fastdata.converters.labels``); the
images sorted by path."""
from __future__ import annotations

import os

from fastdata.converters.labels import scan_labeled
from fastdata.converters.scan import Scan
from fastdata.converters.sources.base import Source, register
from fastdata.converters.units import ConversionError


@register
class LabelsSource(Source):
    """Images under ``src`` with a labels file.

    Args:
        labels: the labels file.
        fields: the kind of a column by name, where not inferred (``--field NAME=KIND``).
    """

    kind = "labels"
    takes = ("labels", "fields")
    described = "a folder of images with a labels file (--labels FILE)"

    def scan(self, *, progress: bool) -> Scan:
        if self.options["labels"] is None:
            raise ValueError("a labels source needs its labels file: give --labels FILE")
        what = os.path.abspath(str(self.options["labels"]))
        scan = scan_labeled(self.src, what, self.options["fields"])
        if not scan.files:
            raise ConversionError(f"none of the images under {self.src!r} has its labels in "
                                  f"{what} ({len(scan.skipped)} left out, e.g. "
                                  f"{scan.skipped[:1]})")
        return scan
