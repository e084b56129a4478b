"""Test-time noise level per input."""

from ._base import BaseSigmaSearch, SigmaSearchResult
from ._fgss import MultiStartFGSS
from ._fixed import FixedSigma
from ._gradient import GradientSigmaSearch
from ._grid import GridSigmaSearch

__all__ = [
    "BaseSigmaSearch",
    "SigmaSearchResult",
    "FixedSigma",
    "GridSigmaSearch",
    "MultiStartFGSS",
    "GradientSigmaSearch",
]
