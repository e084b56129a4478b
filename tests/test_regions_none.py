"""Tests of ``smoothsk.regions.NoRegions``: every input certified on its own, at its own sigma."""

import numpy as np
from scipy import stats

from smoothsk import ABSTAIN, Certificates
from smoothsk.regions import NoRegions, RegionStore
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

    def test_certificates_do_not_depend_on_the_other_inputs_nor_on_the_store(self, make_linear_classifier):
        """Stateless: an input's certificate is the same alone, in any company and after any call."""
        clf = make_linear_classifier([1.0, -1.0], n=200, n0=20, allocator=NoRegions())
        X = np.array([[0.3, 0.0], [-0.2, 0.4], [1.0, 1.0], [0.05, 0.0]], dtype=np.float32)
        together = clf.certify(X, return_details=True)
        for k in (3, 0, 2, 1):
            alone = clf.certify(X[k:k + 1], return_details=True)
            for expected, got in zip(together[:2], alone[:2], strict=True):
                np.testing.assert_array_equal(got, expected[k:k + 1])
            np.testing.assert_array_equal(alone[2].p_lower, together[2].p_lower[k:k + 1])
        assert len(clf.regions_) == 0 and clf.regions_.n_calls == 0
