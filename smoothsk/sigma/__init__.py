"""Test-time noise level per input."""

from ._base import BaseCertifiedSigma, BaseSigmaSearch, CertifiedSigmaResult, SigmaSearchResult
from ._fgss import MultiStartFGSS
from ._fit_context import SigmaFitContext, classifier_levels
from ._fixed import FixedSigma
from ._gradient import GradientSigmaSearch
from ._grid import GridSigmaSearch
from ._selector import CertifiedSigmaSelector
from ._semi_elastic import SemiElasticSigma, semi_elastic_radius

__all__ = [
    "BaseSigmaSearch",
    "SigmaSearchResult",
    "BaseCertifiedSigma",
    "CertifiedSigmaResult",
    "SigmaFitContext",
    "classifier_levels",
    "CertifiedSigmaSelector",
    "FixedSigma",
    "GridSigmaSearch",
    "MultiStartFGSS",
    "GradientSigmaSearch",
    "SemiElasticSigma",
    "semi_elastic_radius",
]
