"""Functional operations on batches of images, and the stages a loader runs.

- ``crop``: the built-in crop stage (``CropStage``: RandomResizedCrop or centre crop, flip,
  resize, normalise; C, torch and batched CUDA kernels); ``boxes``: its box sampling.
- ``normalize``: the one normalisation (``x * scale + shift`` per channel).
- ``color``, ``geometry``: functional colour and geometric operations on float batches.
- ``sample``: the sample hook protocol; ``batch``: the batch hook (``BatchTransform``, the
  normalisation fold, ``BatchHook``).
"""
