"""Deprecated: ``fastdata.readers`` is now ``fastdata.shards`` (this alias goes in the next
release)."""
from fastdata._deprecated import forward


def __getattr__(name: str):
    return forward(__name__, "fastdata.shards", name)
