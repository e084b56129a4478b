"""Training with per-sample noise: objectives and schedules."""

from ._objectives import BaseObjective, GaussianNoise
from ._schedules import BaseTrainingSchedule, FixedSigmaTraining

__all__ = ["BaseObjective", "GaussianNoise", "BaseTrainingSchedule", "FixedSigmaTraining"]
