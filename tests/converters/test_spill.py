"""What a conversion keeps in temporary files: byte strings and records read back as they
were written, across the blocks they are written and read in; a selection and a merge of
ascending positions."""
from __future__ import annotations

import numpy as np

from fastdata.converters import spill
from fastdata.converters.spill import Packed, Spilled, merged, select


def test_packed_and_spilled_read_back_what_was_appended(monkeypatch):
    monkeypatch.setattr(spill, "BLOCK", 7)      # many writes and reads of a few records
    monkeypatch.setattr(Packed, "PENDING", 5)
    blobs = [bytes([k % 251]) * (k % 13) for k in range(100)]
    records = np.arange(300, dtype=np.int64).reshape(100, 3)
    p, s = Packed(), Spilled(np.int64, (3,))
    for k in range(0, 100, 9):
        p.append(blobs[k:k + 9])
        s.append(records[k:k + 9])
    assert len(p) == len(s) == 100
    assert p.block(0, 100) == blobs and list(p.iter_from(37)) == blobs[37:]
    assert (s.block(0, 100) == records).all() and (s.block(95, 200) == records[95:]).all()
    assert len(s.block(100, 120)) == 0
    scalars = Spilled(np.int32)
    scalars.append([5, 6])
    scalars.append(np.array([7], np.int32))
    assert scalars.block(0, 3).tolist() == [5, 6, 7]


def test_a_selection_and_a_merge_of_ascending_positions(monkeypatch):
    monkeypatch.setattr(spill, "BLOCK", 4)
    s = Spilled(np.int64, (3,))
    s.append(np.arange(60).reshape(20, 3))
    rows = Spilled(np.int64)
    rows.append([0, 3, 4, 11, 19])
    assert select(s, rows).block(0, 10)[:, 0].tolist() == [0, 9, 12, 33, 57]
    assert select(s, np.array([], np.int64)).block(0, 1).shape == (0, 3)
    assert list(merged("abcdefghij", np.array([1, 4, 9]))) == [(1, "b"), (4, "e"), (9, "j")]
    assert list(merged("abc", None)) == [(0, "a"), (1, "b"), (2, "c")]
