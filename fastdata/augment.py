"""Deprecated: ``fastdata.augment`` is now ``fastdata.ops.crop``, and its ``Augment`` is
``CropStage`` (this alias goes in the next release)."""
from fastdata._deprecated import forward


def __getattr__(name: str):
    return forward(__name__, "fastdata.ops.crop", {"Augment": "CropStage"}.get(name, name))
