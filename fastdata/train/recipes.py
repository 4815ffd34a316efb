"""Batch transforms from the command line's augmentation options."""
from __future__ import annotations


def train_recipe(a, classes: int, label_kind: str):
    """``fastdata train``'s batch transform from its augmentation options, in the order of
    torchvision's references (MixUp or CutMix last), or None without any.

    Raises:
        ValueError: MixUp, CutMix or label smoothing asked of labels that are not classes.
    """
    from fastdata import transforms as T
    from fastdata.ops.normalize import IMAGENET_MEAN

    if label_kind != "class" and (a.mixup_alpha or a.cutmix_alpha or a.label_smoothing):
        raise ValueError(f"--mixup-alpha, --cutmix-alpha and --label-smoothing work on class "
                         f"labels; this set's labels are {label_kind}")
    if label_kind in ("detection", "segmentation") and a.auto_augment:
        raise ValueError(f"--auto-augment moves pixels (shear, rotate, translate) without this "
                         f"{label_kind} set's {'boxes' if label_kind == 'detection' else 'maps'}"
                         f": leave it out")
    ops: list = []
    if a.color_jitter:
        ops.append(T.ColorJitter(a.color_jitter, a.color_jitter, a.color_jitter))
    if a.auto_augment == "ta_wide":
        ops.append(T.TrivialAugment())
    if a.random_erase:      # the mean colour: torchvision's 0 after normalising
        ops.append(T.RandomErasing(a.random_erase, value=IMAGENET_MEAN))
    mix = ([T.MixUp(a.mixup_alpha, num_classes=classes)] if a.mixup_alpha else []) + \
        ([T.CutMix(a.cutmix_alpha, num_classes=classes)] if a.cutmix_alpha else [])
    if mix:
        ops.append(mix[0] if len(mix) == 1 else T.RandomChoice(mix))
    return T.Compose(ops) if ops else None
