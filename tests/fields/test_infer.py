"""A column's kind, inferred from its name and values, and ``--field NAME=KIND``."""
from __future__ import annotations

import pytest

from fastdata.fields import field_of
from fastdata.fields.infer import MAX_CLASSES, field_option, infer


@pytest.mark.parametrize("name, cells, want", [
    ("label", ["dog", "cat", "dog"], field_of("class", classes=["cat", "dog"])),
    ("class", ["2", "0", "2"], field_of("class", classes=["0", "1", "2"])),
    ("label", [1, 0], field_of("class", classes=["0", "1"])),
    ("caption", ["a cat on a mat", "two dogs", "a cat on a mat"], field_of("text")),
    ("caption", ["3 cats", "12"], field_of("text")),            # not every cell is a number
    ("score", ["0.5", "-2", "1e3", " 7 "], field_of("float")),
    ("score", [0.5, 3], field_of("float")),
    ("embedding", ["[0.1, 0.2, 0.3]", "[1, 2, 3]"], field_of("array", shape=[3],
                                                          dtype="float32")),
    ("embedding", [[0.5, 1.5], [2.5, 3.5]], field_of("array", shape=[2], dtype="float32")),
    ("tokens", ["[1, 2, 3]", "[4]"], field_of("tokens", dtype="uint16")),
    ("tokens", ["[1, -2]", "[70000]"], field_of("tokens", dtype="int32")),
    ("ragged", ["[0.5]", "[1.5, 2]"], field_of("json")),
    ("meta", ['{"w": 640}', {"h": 480}], field_of("json")),
    ("tags", ['["a", "b"]', "[]"], field_of("json")),
    ("caption", ["{not json", "plain"], field_of("text")),
    ("empty", [], field_of("text")),
])
def test_a_column_kind_is_inferred_from_its_name_and_values(name, cells, want):
    kind = infer(name, cells)
    assert kind == want
    for k, cell in enumerate(cells):        # every value then parses as that kind
        kind.parse(cell, f"row {k}")


def test_an_integer_label_may_not_make_millions_of_classes():
    with pytest.raises(ValueError, match=f"class indices 0..{MAX_CLASSES - 1}"):
        infer("label", ["0", str(MAX_CLASSES)])


@pytest.mark.parametrize("text, want", [("caption=text", ("caption", "text")),
                                        (" emb = array ", ("emb", "array"))])
def test_a_field_option_names_the_field_and_its_kind(text, want):
    assert field_option(text) == want


@pytest.mark.parametrize("text, match", [
    ("caption", "is not NAME=KIND"), ("=text", "is not NAME=KIND"),
    ("caption=string", "kind 'string' is not valid; choose one of"),
])
def test_a_bad_field_option_says_the_form_and_the_kinds(text, match):
    with pytest.raises(ValueError, match=match):
        field_option(text)
