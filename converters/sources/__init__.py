"""Where a conversion's samples come from, behind one interface (``base.Source``), one module
a kind, each registered by name in ``SOURCES``: ``folder`` (ImageFolder), ``labels`` (a folder
with a labels file), ``coco`` and ``masks`` (``annotated``), ``webdataset`` (tars),
``parquet`` (tables of image bytes or paths) and ``hf`` (Hugging Face datasets)."""
# each module registers its kind
from fastdata.converters.sources import (  # noqa: F401
    annotated,
    folder,
    hf,
    labelled,
    parquet,
    webdataset,
)
from fastdata.converters.sources.base import SOURCES, Images, Source, Span, register, source_for

__all__ = ["SOURCES", "Images", "Source", "Span", "register", "source_for"]
