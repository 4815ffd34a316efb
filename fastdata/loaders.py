"""Deprecated: ``fastdata.loaders`` is now ``fastdata.loader`` (this alias goes in the next
release)."""
from fastdata._deprecated import forward


def __getattr__(name: str):
    return forward(__name__, "fastdata.loader", name)
