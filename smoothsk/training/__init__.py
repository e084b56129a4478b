"""Training with per-sample noise: objectives and schedules."""

from ..objectives import BaseObjective, Consistency, GaussianNoise, Macer, MacerTerms, NoisyCopiesObjective, SmoothAdv
from ._base import BaseTrainingSchedule
from ._data_dependent import DataDependentTraining
from ._fixed import FixedSigmaTraining
from ._insta_rs import InstaRSTrain
from ._pretrain_finetune import PretrainFinetune
from ._stage import Stage

__all__ = [
    "BaseObjective",
    "NoisyCopiesObjective",
    "GaussianNoise",
    "SmoothAdv",
    "Macer",
    "MacerTerms",
    "Consistency",
    "BaseTrainingSchedule",
    "Stage",
    "FixedSigmaTraining",
    "PretrainFinetune",
    "InstaRSTrain",
    "DataDependentTraining",
]
