"""An image folder in ImageFolder's layout (``--source folder``, the default): a subfolder per
class, the images in it (``fastdata.converters.scan``), in sorted order."""
from __future__ import annotations

from fastdata.checks import printable
from fastdata.converters.scan import Scan, scan_folder
from fastdata.converters.sources.base import Source, register
from fastdata.converters.units import ConversionError
from fastdata.format import IMAGE_EXTENSIONS


@register
class FolderSource(Source):
    """An ImageFolder tree: ``src/<class>/**/<image>``."""

    kind = "folder"
    described = "an image folder, ImageFolder's layout (SRC/<class>/<images>)"

    def scan(self, *, progress: bool) -> Scan:
        scan = scan_folder(self.src, progress=progress)
        if not scan.files:
            raise ConversionError(_nothing_found(scan))
        return scan


def _nothing_found(scan: Scan) -> str:
    """What a source folder without image files holds instead, in one line."""
    n = len(scan.classes)
    ignored = ", ".join(f"{count} {printable(reason)}" for reason, count in
                        sorted(scan.ignored.items(), key=lambda kv: -kv[1]))
    return (f"no image files in {scan.root!r}: {n} class folder{'' if n == 1 else 's'} "
            f"({', '.join(map(printable, scan.classes[:5]))}{', ...' if n > 5 else ''}) and "
            f"no file with an image extension ({', '.join(IMAGE_EXTENSIONS)}) in "
            f"{'it' if n == 1 else 'them'}" + (f"; ignored: {ignored}" if ignored else
                                                ": they are empty"))
