"""smoothsk: certified robustness by sample-wise randomized smoothing, as a scikit-learn estimator."""

from .certificates import ABSTAIN, Certificates
from .estimator import SampleWiseSmoothedClassifier

__version__ = "0.1.0"
__all__ = ["ABSTAIN", "Certificates", "SampleWiseSmoothedClassifier", "__version__"]
