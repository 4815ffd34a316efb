"""``SampleSource``: what a loader reads, a ``ShardSet``, a ``Mixture`` or any object with the
same members (the loader and both backends use these alone)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fastdata.order import Draw


@runtime_checkable
class SampleSource(Protocol):
    """Samples by index: their labels, stored pixels and names, in one index space."""

    classes: list[str]
    label_kind: str
    #: the fields beside each image and label: name -> ``fastdata.fields.FieldKind``
    fields: dict
    encoding: str
    sizes: tuple[int, ...]
    size: int
    @property
    def draw(self) -> Draw | None:
        """The epoch's own draw of indices (a mixture's); None: each sample once."""

    def __len__(self) -> int: ...

    @property
    def epoch_size(self) -> int:
        """Samples in an epoch (``len`` unless ``draw`` says otherwise)."""

    @property
    def root(self) -> str:
        """A folder, for messages."""

    @property
    def location(self) -> str:
        """Where the samples are (a URL without credentials, or a folder), for messages."""

    @property
    def shards(self) -> list:
        """The shard readers, whose access pattern a loader sets."""

    @property
    def annotations(self) -> Any:
        """A detection or segmentation set's targets (None otherwise)."""

    def stored_size(self, size) -> int:
        """``size`` as an int, or a ValueError naming the sizes stored."""

    def labels_of(self, indices) -> np.ndarray:
        """The labels of ``indices``."""

    def field_values(self, name: str, indices) -> list | np.ndarray:
        """Field ``name``'s values of ``indices``: an array (fixed-size kinds), else a list."""

    def source_of(self, indices) -> np.ndarray:
        """Which part (a mixture's set; 0 for a set) each of ``indices`` is from."""

    def read_batch(self, indices, size: int | None = None,
                   out: np.ndarray | None = None) -> np.ndarray:
        """The stored pixels of ``indices``, ``(B, S, S, 3)`` uint8."""

    def raw_views(self, indices, size: int | None = None,
                  hold: contextlib.ExitStack | None = None) -> list | None:
        """Views of each stored image where they can be had without a copy, else None."""

    def read_encoded(self, indices, size: int | None = None) -> list:
        """Each of ``indices``' stored JPEG bytes."""

    def sample_names(self, indices) -> Callable[[int], str]:
        """``name(k)``: sample ``indices[k]`` named for a message (index, shard)."""

    def check_intact(self, indices) -> None:
        """Raise naming the shard of ``indices`` cut short under its maps."""

    def fetch_ahead(self, indices, in_flight: int | None = None, processes: int = 1,
                    ranks: int = 1) -> Any:
        """Start fetching a remote set's shards in the order ``indices`` reads them (None:
        local)."""

    def close(self) -> None:
        """Close the files."""
