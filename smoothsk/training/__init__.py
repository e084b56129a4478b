"""Training with per-sample noise: objectives and schedules."""

from ..objectives import (
    BaseNoisyCopiesObjective,
    BaseObjective,
    Consistency,
    GaussianNoise,
    Macer,
    MacerTerms,
    SmoothAdv,
)
from ._base import BaseTrainingSchedule
from ._data_dependent import DataDependentTraining
from ._fixed import FixedSigmaTraining
from ._insta_rs import InstaRSTrain
from ._pretrain_finetune import PretrainFinetune
from ._pretrained import Pretrained
from ._stage import Stage

__all__ = [
    "BaseObjective",
    "BaseNoisyCopiesObjective",
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
    "Pretrained",
]
