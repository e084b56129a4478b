"""NoRegions, the region store and the certificates it produces."""

import numpy as np
import pytest
from scipy import stats

from smoothsk import ABSTAIN, Certificates
from smoothsk.regions import NoRegions, RegionStore
from smoothsk.regions._base import certificates_from_sampling
from smoothsk.sampling import SamplingResult


class TestNoRegions:
    def test_certifies_every_input_once_at_its_own_sigma(self):
        calls = []

        def certify_fn(rows, sigma, stage):
            calls.append((rows.tolist(), sigma.tolist(), stage))
            return SamplingResult(np.array([1, ABSTAIN, 0]), np.array([0.9, 0.4, 0.99]), np.array([50, 50, 50]))

        regions = RegionStore.empty(2)
        sigma = np.array([0.25, 0.5, 1.0])
        certificates = NoRegions().allocate(regions, np.zeros((3, 2), dtype=np.float32), sigma, certify_fn)
        assert calls == [([0, 1, 2], [0.25, 0.5, 1.0], (1,))]
        assert isinstance(certificates, Certificates)
        np.testing.assert_allclose(certificates.radius, [0.25 * stats.norm.ppf(0.9), 0.0, stats.norm.ppf(0.99)])
        np.testing.assert_array_equal(certificates.prediction, [1, ABSTAIN, 0])
        np.testing.assert_array_equal(certificates.sigma, sigma)
        np.testing.assert_array_equal(certificates.region, [-1, -1, -1])
        np.testing.assert_array_equal(certificates.search_steps, [0, 0, 0])
        assert len(regions) == 0

    def test_predict_uses_the_searched_sigma(self):
        sigma = NoRegions().assign_sigma(RegionStore.empty(2), np.zeros((2, 2)), [0.3, 0.7])
        assert sigma.dtype == np.float64 and sigma.tolist() == [0.3, 0.7]

    def test_no_parameters(self):
        assert NoRegions().get_params() == {}


class TestRegionStore:
    def test_append_returns_indices_and_keeps_dtypes(self):
        store = RegionStore.empty(3)
        assert len(store) == 0 and store.centres.shape == (0, 3)
        first = store.append(np.ones((2, 3)), [0.5, 1.0], [0.25, 0.25], [1, 2], [0.9, 0.99])
        second = store.append(np.zeros((1, 3)), [2.0], [0.5], [0], [0.999])
        assert first.tolist() == [0, 1] and second.tolist() == [2] and len(store) == 3
        assert store.centres.dtype == np.float32 and store.predictions.dtype == np.int64
        assert store.radii.tolist() == [0.5, 1.0, 2.0]


class TestCertificatesFromSampling:
    def test_abstentions_get_zero_radius_even_with_a_high_bound(self):
        sampling = SamplingResult(np.array([ABSTAIN, 2]), np.array([0.8, 0.8]), np.array([10, 10]))
        certificates = certificates_from_sampling(sampling, np.array([1.0, 1.0]), region=np.array([4, 5]))
        assert certificates.radius[0] == 0.0
        assert certificates.radius[1] == pytest.approx(stats.norm.ppf(0.8))
        assert certificates.region.tolist() == [4, 5]
