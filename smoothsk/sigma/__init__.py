"""Test-time noise level per input."""

from ._base import BaseSigmaSearch, SigmaSearchResult
from ._fixed import FixedSigma

__all__ = ["BaseSigmaSearch", "SigmaSearchResult", "FixedSigma"]
