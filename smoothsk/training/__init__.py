"""Training with per-sample noise: objectives and schedules."""

from ._data_dependent import DataDependentTraining
from ._insta_rs import InstaRSTrain
from ._macer import Macer, MacerTerms
from ._objectives import BaseObjective, GaussianNoise
from ._pretrain_finetune import PretrainFinetune
from ._schedules import BaseTrainingSchedule, FixedSigmaTraining
from ._smoothadv import SmoothAdv

__all__ = [
    "BaseObjective",
    "GaussianNoise",
    "SmoothAdv",
    "Macer",
    "MacerTerms",
    "BaseTrainingSchedule",
    "FixedSigmaTraining",
    "PretrainFinetune",
    "InstaRSTrain",
    "DataDependentTraining",
]
