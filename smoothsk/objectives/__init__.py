"""Training objectives: how one batch with per-sample noise levels becomes a loss.

Their public home is :mod:`smoothsk.training`, which re-exports them
(``smoothsk.training.GaussianNoise``). They form a package of their own
because two layers train with them: the training schedules, and the
certified sigma selector of :mod:`smoothsk.sigma` (its
``selector_objective``), which the schedules import in turn.
"""

from ._base import BaseNoisyCopiesObjective, BaseObjective, GaussianNoise
from ._consistency import Consistency
from ._macer import Macer, MacerTerms
from ._smoothadv import SmoothAdv

__all__ = ["BaseObjective", "BaseNoisyCopiesObjective", "GaussianNoise", "SmoothAdv", "Macer", "MacerTerms",
           "Consistency"]
