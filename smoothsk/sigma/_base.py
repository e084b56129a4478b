"""Base class of the test-time noise-level searches."""

from abc import abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from .._components import Component

#: Engine stages reserved for searches: ``(SEARCH_STAGE, step, ...)``.
SEARCH_STAGE = 0


@dataclass
class SigmaSearchResult:
    """Outcome of a search over inputs.

    Attributes
    ----------
    sigma : ndarray of float, shape (n_inputs,)
        Noise level chosen for each input.
    steps : ndarray of int, shape (n_inputs,)
        Search steps (noise-level evaluations) spent on each input.
    """

    sigma: np.ndarray
    steps: np.ndarray


class BaseSigmaSearch(Component):
    """Chooses a noise level per input.

    A search may look at the model through the engine, but only with noise
    from the ``SEARCH_STAGE`` streams: certification then draws fresh,
    independent samples at the chosen sigma, so the certificate stays valid.
    """

    def search(self, engine, X, y=None):
        """Choose sigma for each input.

        Parameters
        ----------
        engine : MonteCarloEngine
            Sampling access to the base model.
        X : torch.Tensor, shape (n_inputs, *input_shape)
            Inputs.
        y : array-like or torch.Tensor of int, shape (n_inputs,), optional
            Class indices; searches that use labels (training-time sigma
            assignment, PFAT Eq. 5) maximise the radius among correct
            predictions. Subclasses receive them as an int64 ndarray.

        Returns
        -------
        SigmaSearchResult
        """
        self.validate()
        if y is not None:
            y = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y, dtype=np.int64)
        result = self._search(engine, X, y)
        return SigmaSearchResult(np.asarray(result.sigma, dtype=np.float64),
                                 np.asarray(result.steps, dtype=np.int64))

    @abstractmethod
    def _search(self, engine, X, y):
        """Return a :class:`SigmaSearchResult` for validated parameters."""
