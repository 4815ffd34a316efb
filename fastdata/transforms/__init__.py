"""Batch transforms: users' augmentations on the output device, after the crop.

A ``Loader`` runs, per batch::

    stored uint8 image → sample_transform (CPU, per image, in the reader workers)
      → built-in crop/resize/flip → values in [0, 1]
      → batch_transform (the output device, whole batch) → (x - mean) / std, dtype, layout

``sample_transform(image, rng)`` takes the stored ``(S, S, 3)`` uint8 image and a
``numpy.random.Generator`` and returns an image of the same shape (an array or a PIL image). It
runs *before* the crop: the crop then runs where it is fastest (fused with normalisation on the
CPU, batched on a GPU), which an op after it would force back onto the host.

``batch_transform(images, labels)`` (optionally with a ``generator`` keyword) takes ``(B, 3, H,
W)`` float32 images in [0, 1], where colour ops are defined (torchvision's ColorJitter expects
them), and the labels (int64 ``(B,)``, or float ``(B, C)``), and returns both. The classes here
are such transforms, composable with ``Compose`` and ``RandomChoice``. Each draws what is per
image on the images' device and what is per batch on the host, from the ``generator`` the
loader passes (seeded by ``(seed, epoch, rank, batch)``), so no transform makes the host wait
for the device and both backends draw the same values. The functional operations they are
made of are in ``fastdata.ops``.

``Tokenize`` is a text field's batch function (``Loader(field_transforms=...)``), run in the
reader workers: a batch's strings as a fixed-length tensor of token ids.
"""
from fastdata.ops.batch import BatchTransform
from fastdata.transforms.color import ColorJitter, RandomGrayscale
from fastdata.transforms.compose import Compose, PerImage, RandomChoice
from fastdata.transforms.erasing import RandomErasing
from fastdata.transforms.mix import CutMix, MixUp, check_classes, soft_targets
from fastdata.transforms.tokenize import Tokenize
from fastdata.transforms.trivial import TRIVIAL_OPS, TrivialAugment

__all__ = ["BatchTransform", "ColorJitter", "Compose", "CutMix", "MixUp", "PerImage",
           "RandomChoice", "RandomErasing", "RandomGrayscale", "TRIVIAL_OPS", "TrivialAugment",
           "Tokenize", "check_classes", "soft_targets"]
