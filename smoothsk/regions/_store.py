"""The robust regions an estimator has allocated (its ``regions_``)."""

from dataclasses import dataclass

import numpy as np


@dataclass
class RegionStore:
    """Balls allocated so far, one row per region.

    Attributes
    ----------
    centres : ndarray of float32, shape (n_regions, n_features)
        Flattened inputs the regions are centred on.
    radii : ndarray of float64, shape (n_regions,)
        Certified radius of each region.
    sigmas : ndarray of float64, shape (n_regions,)
        Noise level each region was certified at.
    predictions : ndarray of int64, shape (n_regions,)
        Class index each region certifies.
    """

    centres: np.ndarray
    radii: np.ndarray
    sigmas: np.ndarray
    predictions: np.ndarray

    @classmethod
    def empty(cls, n_features):
        """A store with no regions for inputs of ``n_features`` values."""
        return cls(np.zeros((0, n_features), dtype=np.float32), np.zeros(0), np.zeros(0),
                   np.zeros(0, dtype=np.int64))

    def __len__(self):
        return len(self.radii)

    def append(self, centres, radii, sigmas, predictions):
        """Add regions; returns the indices they were stored at.

        Parameters
        ----------
        centres : ndarray, shape (n_new, n_features)
        radii, sigmas : ndarray of float, shape (n_new,)
        predictions : ndarray of int, shape (n_new,)

        Returns
        -------
        index : ndarray of int, shape (n_new,)
        """
        start = len(self)
        self.centres = np.concatenate([self.centres, np.asarray(centres, dtype=np.float32)])
        self.radii = np.concatenate([self.radii, np.asarray(radii, dtype=np.float64)])
        self.sigmas = np.concatenate([self.sigmas, np.asarray(sigmas, dtype=np.float64)])
        self.predictions = np.concatenate([self.predictions, np.asarray(predictions, dtype=np.int64)])
        return np.arange(start, len(self))
