"""smoothsk: certified robustness by sample-wise randomized smoothing, as a scikit-learn estimator."""

from ._version import __version__
from .certificates import ABSTAIN, Certificates
from .estimator import SampleWiseSmoothedClassifier
from .pipeline import certify

__all__ = ["ABSTAIN", "Certificates", "SampleWiseSmoothedClassifier", "certify", "__version__"]
