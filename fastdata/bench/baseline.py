"""The pipeline users have today, as the reference ``fastdata bench`` compares against:
ImageFolder-style dataset, PIL decode, RandomResizedCrop + flip + ToTensor + Normalize per
image in DataLoader workers, pinned memory on CUDA.

torchvision's classes are used when torchvision imports; otherwise an in-package equivalent
(the same RandomResizedCrop parameter sampling, PIL bilinear resize of the box, flip, scale,
normalise). ``kind`` says which ran.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from fastdata.format import IMAGE_EXTENSIONS
from fastdata.ops.boxes import random_resized_crop_boxes
from fastdata.ops.normalize import IMAGENET_MEAN, IMAGENET_STD


def image_folder(root: str) -> tuple[list[str], list[tuple[str, int]]]:
    """``(classes, [(path from root, class index)])`` as torchvision's ``ImageFolder`` finds
    them: a sorted folder per class, image files found by their extension, links followed
    (each folder once), hidden entries left out."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"source folder {root!r} does not exist or is not a directory")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and e.name[0] != ".")
    files: list[tuple[str, int]] = []
    seen: set[str] = set()
    for label, name in enumerate(classes):
        found = []
        for folder, dirs, names in os.walk(os.path.join(root, name), followlinks=True):
            real = os.path.realpath(folder)
            if real in seen:            # a link back up the tree: walked once
                dirs.clear()
                continue
            seen.add(real)
            dirs[:] = [d for d in dirs if d[0] != "."]
            found += [os.path.relpath(os.path.join(folder, f), root) for f in names
                      if f[0] != "." and f.lower().endswith(IMAGE_EXTENSIONS)]
        files += [(path, label) for path in sorted(found)]
    return classes, files


class PILFolder(torch.utils.data.Dataset):
    def __init__(self, root: str, *, crop: int = 224, exclude=()):
        """``exclude``: paths (relative to ``root``) left out, such as the inputs a conversion
        of ``root`` skipped as unreadable, so the baseline reads the images the shards hold."""
        self.root, self.crop = root, crop
        self.classes, files = image_folder(root)
        self.files = [f for f in files if f[0] not in set(exclude)]
        try:
            from torchvision import transforms as T
            self.tf = T.Compose([T.RandomResizedCrop(crop), T.RandomHorizontalFlip(),
                                 T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
            self.kind = "torchvision"
        except Exception:  # noqa: BLE001 - torchvision is optional (and may not import)
            self.tf, self.kind = self._equivalent, "in-package equivalent of torchvision"
        self.mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def _equivalent(self, img):
        from PIL import Image

        top, left, h, w = random_resized_crop_boxes(1, img.height, img.width)[0].tolist()
        img = img.resize((self.crop, self.crop), Image.BILINEAR,
                         box=(left, top, left + w, top + h))
        if torch.rand(1) < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.array(img)).permute(2, 0, 1).float().div_(255)
        return (x - self.mean) / self.std

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        from PIL import Image

        path, label = self.files[i]
        with Image.open(os.path.join(self.root, path)) as img:
            return self.tf(img.convert("RGB")), label


def baseline_loader(root: str, *, batch_size: int, crop: int = 224, num_workers: int = 2,
                    device: torch.device | None = None, seed: int = 0, exclude=()):
    """A shuffled DataLoader over ``root`` (full batches), and the dataset (for ``kind``)."""
    ds = PILFolder(root, crop=crop, exclude=exclude)
    dl = torch.utils.data.DataLoader(
        ds, batch_size=batch_size, shuffle=True, num_workers=num_workers, drop_last=True,
        pin_memory=device is not None and device.type == "cuda",
        persistent_workers=num_workers > 0,
        generator=torch.Generator().manual_seed(seed))
    return dl, ds
