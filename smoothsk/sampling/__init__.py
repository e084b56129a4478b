"""Monte Carlo sample sizes per input."""

from ._base import BaseSampler, SamplingResult
from ._fixed import FixedSampler

__all__ = ["BaseSampler", "SamplingResult", "FixedSampler"]
