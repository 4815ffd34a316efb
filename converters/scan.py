"""Walk an ImageFolder-style tree: ``root/<class>/**/<image>``.

Classes are the sorted names of the top-level directories (as torchvision's ImageFolder), files
are matched by extension case-insensitively, nested sub-directories and symlinks (to files and to
directories, loops broken) are followed, dotfiles/dot-directories, non-image files and images
directly in ``root`` (in no class) are ignored and counted. A class directory without images
keeps its index (so indices always match sorted folder names, like
``ImageFolder(allow_empty=True)``); the converter reports it as empty.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from tqdm import tqdm

from fastdata.format import IMAGE_EXTENSIONS


@dataclass
class Scan:
    root: str
    classes: list[str]
    files: list[tuple[str, int]]            # (path relative to root, label), sorted
    ignored: dict[str, int] = field(default_factory=dict)   # reason -> count


def scan_folder(root: str, *, progress: bool = False) -> Scan:
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"source folder {root!r} does not exist or is not a directory")
    entries = [e for e in os.scandir(root) if not e.name.startswith(".")]
    classes = sorted(e.name for e in entries if e.is_dir())
    loose = sum(e.name.lower().endswith(IMAGE_EXTENSIONS) for e in entries if not e.is_dir())
    if not classes:
        found = f"; it holds {loose} image{'' if loose == 1 else 's'} directly: move them into " \
            f"class folders" if loose else ""
        raise ValueError(f"no class directories in {root!r}: expected root/<class>/<images> "
                         f"(the ImageFolder layout){found}")
    ignored: dict[str, int] = {}
    if loose:       # as ImageFolder: they belong to no class (counted, so the summary shows it)
        ignored["image outside the class directories"] = loose
    files: list[tuple[str, int]] = []
    # ImageNet: 1.28M files to list before the first image is decoded
    bar = tqdm(total=len(classes), unit="class", desc="scan", disable=not progress,
               dynamic_ncols=True)
    for label, name in enumerate(classes):
        found = []
        seen = set()
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, name), followlinks=True):
            real = os.path.realpath(dirpath)
            if real in seen:            # a symlink loop: do not descend twice
                dirnames[:] = []
                continue
            seen.add(real)
            for d in [d for d in dirnames if d.startswith(".")]:
                dirnames.remove(d)
                ignored["hidden"] = ignored.get("hidden", 0) + 1
            rel = os.path.relpath(dirpath, root) + os.sep     # once a folder, not per file
            for fn in filenames:
                if fn.startswith("."):
                    reason = "hidden"
                elif not fn.lower().endswith(IMAGE_EXTENSIONS):
                    reason = "not an image extension"
                elif not os.path.isfile(os.path.join(dirpath, fn)):
                    reason = "broken link"
                else:
                    found.append(rel + fn)
                    continue
                ignored[reason] = ignored.get(reason, 0) + 1
        files.extend((p, label) for p in sorted(found))
        bar.update(1)
    bar.close()
    return Scan(root, classes, files, ignored)
