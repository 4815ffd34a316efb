"""Field kinds: each value round-trips through a shard's column; a bad value or a tampered
column is refused naming where; a kind is one registered class."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata.fields import FIELDS, Column, FieldError, FieldKind, field_of, register
from fastdata.fields.base import MAX_VALUE_BYTES

TEXTS = ["a cat on a mat", "", "Ünïcödé – 猫が座る 🐈", "x" * 100_000, "line\nbreak, \"quoted\""]
CASES = [
    (field_of("class", classes=["cat", "dog"]), ["dog", "cat", " dog "], [1, 0, 1]),
    (field_of("multilabel", classes=["a", "b", "c"]), ["a|c", "", ["b"]],
     [[1, 0, 1], [0, 0, 0], [0, 1, 0]]),
    (field_of("float"), ["0.5", -2, "1e3"], [0.5, -2.0, 1000.0]),
    (field_of("float", length=3), ["[1, 2, 3]", "4 5 6", [7, 8, 9]],
     [[1, 2, 3], [4, 5, 6], [7, 8, 9]]),
    (field_of("text"), TEXTS, TEXTS),
    (field_of("tokens", dtype="uint16"), ["[1, 2, 65535]", "7", []], [[1, 2, 65535], [7], []]),
    (field_of("tokens", dtype="int64"), [[-(2 ** 40), 3]], [[-(2 ** 40), 3]]),
    (field_of("array", shape=[2, 4], dtype="float16"), [np.ones((2, 4)), "[[0,1,2,3],[4,5,6,7]]"],
     [np.ones((2, 4)), np.arange(8).reshape(2, 4)]),
    (field_of("array", shape=[3], dtype="int8"), [[1, -2, 3]], [[1, -2, 3]]),
    (field_of("array", shape=[2], dtype="bool"), [[True, False]], [[True, False]]),
    (field_of("json"), ['{"w": 640, "tags": ["x"]}', {"a": None}, "[1, 2.5]", '"s"'],
     [{"w": 640, "tags": ["x"]}, {"a": None}, [1, 2.5], "s"]),
]


@pytest.mark.parametrize("kind, cells, want", CASES, ids=lambda c: getattr(c, "kind", None))
def test_every_kind_round_trips_through_a_column(kind, cells, want):
    values = [kind.parse(c, f"row {k}") for k, c in enumerate(cells)]
    column = kind.pack(values)
    assert len(column) == len(cells)
    kind.check(column, len(cells), "shard-00000")
    back = kind.read(column, np.arange(len(cells))[::-1])[::-1]     # any order of samples
    batch = kind.collate(back)
    if kind.fixed:
        assert torch.is_tensor(batch) and batch.shape == (len(cells), *kind.shape)
        assert np.array_equal(batch.numpy(), np.asarray(want, kind.dtype))
    elif kind.kind == "tokens":
        assert [t.dtype for t in batch] == [torch.int64] * len(cells)
        assert [t.tolist() for t in batch] == want
    else:
        assert batch == want
    assert field_of(kind.kind, **kind.params()) == kind      # what a manifest records
    assert kind.kind in kind.describe(column)


def test_text_lengths_are_described():
    kind = field_of("text")
    line = kind.describe(kind.pack(["ab", "abcd", "é"]))
    assert line == "text: 2-4 bytes, mean 3"


@pytest.mark.parametrize("kind, cell, match", [
    (field_of("class", classes=["cat"]), "dog", "row 3, col caption: 'dog' is not one of"),
    (field_of("multilabel", classes=["a"]), "a|z", "'z' is not one of the field's 1 classes"),
    (field_of("float"), "cheap", "'cheap' is not a number"),
    (field_of("float"), "nan", "not finite"),
    (field_of("float", length=2), "[1, 2, 3]", "3 numbers, not 2"),
    (field_of("text"), 5, "int '5' is not text"),
    (field_of("text"), "\ud800", "lone surrogate is not UTF-8"),
    (field_of("text", max_bytes=8), "123456789", "a value of 9 bytes, more than the 8"),
    (field_of("tokens", dtype="uint16"), "[1, 70000]", "a token outside uint16's 0..65535"),
    (field_of("tokens"), "[1.5]", "is not a list of integers"),
    (field_of("array", shape=[8], dtype="float16"), "[1, 2]", r"shape \(2,\), not \(8,\)"),
    (field_of("array", shape=[2], dtype="uint8"), "[1, 300]", "values that are not uint8"),
    (field_of("array", shape=[2], dtype="int32"), "[1, 2.5]", "values that are not int32"),
    (field_of("json"), "{'a': 1}", "not JSON"),
    (field_of("json"), "NaN", "NaN is not JSON"),
    (field_of("json", max_bytes=4), '"12345"', "more than the 4"),
])
def test_a_bad_value_is_refused_naming_where(kind, cell, match):
    with pytest.raises(FieldError, match=match):
        kind.parse(cell, "row 3, col caption")


def test_a_tampered_column_is_refused_naming_the_shard():
    text = field_of("text")
    good = text.pack(["ab", "cd"])
    for bad, match in [
        (Column(good.values, np.array([0, 3, 2], np.int64)), "offsets do not cut"),
        (Column(good.values, np.array([0, 2, 9], np.int64)), "offsets do not cut"),
        (Column(good.values, None), "offsets do not cut"),
        (Column(np.frombuffer(b"\xff\xfe", np.uint8), np.array([0, 1, 2], np.int64)),
         "value 0: not UTF-8"),
    ]:
        with pytest.raises(FieldError, match=f"shard-00007.*{match}"):
            text.check(bad, 2, "shard-00007")
    with pytest.raises(FieldError, match="3 values"):
        text.check(good, 3, "shard-00007")
    emb = field_of("array", shape=[4], dtype="float16")
    with pytest.raises(FieldError, match=r"float32 values of shape \(2, 4\), not float16"):
        emb.check(Column(np.zeros((2, 4), np.float32)), 2, "shard-00007")
    cls = field_of("class", classes=["a", "b"])
    with pytest.raises(FieldError, match=r"class indices outside 0..1"):
        cls.check(Column(np.array([0, 5], np.int64)), 2, "shard-00007")
    tokens = field_of("tokens", dtype="int32")
    with pytest.raises(FieldError, match="not whole int32 tokens"):
        tokens.check(Column(np.zeros(3, np.uint8), np.array([0, 3], np.int64)), 1, "s")


@pytest.mark.parametrize("kind, params, match", [
    ("caption", {}, "kind='caption' is not valid; choose one of"),
    ("class", {"classes": []}, "classes=\\[\\] is not valid"),
    ("class", {"classes": ["a", "a"]}, "names a class twice"),
    ("array", {"shape": [0]}, "shape=\\[0\\] is not valid"),
    ("array", {"shape": [1 << 12, 1 << 12]}, "more than 4,194,304 values"),
    ("array", {"shape": [2], "dtype": "complex64"}, "dtype='complex64' is not valid"),
    ("tokens", {"dtype": "float32"}, "dtype='float32' is not valid; choose one of uint16"),
    ("float", {"length": 0}, "length=0 is not valid"),
    ("text", {"max_bytes": 0}, "max_bytes=0 is not valid"),
])
def test_a_bad_kind_or_parameter_names_the_valid_choices(kind, params, match):
    """A manifest's field is read back through the same checks as a user's."""
    with pytest.raises(ValueError, match=match):
        field_of(kind, **params)


def test_a_new_kind_is_one_registered_class():
    @register
    class Rating(FieldKind):
        kind = "rating"
        dtype = np.dtype(np.uint8)

        def parse(self, cell, where):
            stars = str(cell).count("*")
            if not 1 <= stars <= 5:
                raise FieldError(f"{where}: {cell!r} is not 1 to 5 stars")
            return stars

    try:
        kind = field_of("rating")
        column = kind.pack([kind.parse(c, "") for c in ("***", "*****")])
        kind.check(column, 2, "")
        assert kind.collate(kind.read(column, np.array([1, 0]))).tolist() == [5, 3]
    finally:
        del FIELDS["rating"]


def test_no_value_may_exceed_the_limit_by_default():
    with pytest.raises(FieldError, match=f"more than the {MAX_VALUE_BYTES:,}"):
        field_of("text").parse("x" * (MAX_VALUE_BYTES + 1), "row 1")
