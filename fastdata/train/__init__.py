"""Training: ``TrainStep`` (AMP, accumulation, DDP no_sync), distributed set-up, ``fit``, models."""
from fastdata.train.fit import evaluate, fit, make_scheduler
from fastdata.train.models import build_model
from fastdata.train.step import TrainStep

__all__ = ["TrainStep", "fit", "evaluate", "make_scheduler", "build_model"]
