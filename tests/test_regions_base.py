"""Tests of ``smoothsk.regions._base``: what every allocator promises, checked through the estimator."""

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from smoothsk import ABSTAIN, SampleWiseSmoothedClassifier
from smoothsk.regions import MemoryAllocator, NoRegions, OnlineBallAllocator
from smoothsk.regions._base import certificates_from_sampling
from smoothsk.sampling import FixedSampler, SamplingResult

from regions_support import ALLOCATORS, FirstCoordinateSigma, assert_disjoint, linear_estimator


class TestCertificatesFromSampling:
    def test_abstentions_get_zero_radius(self):
        sampling = SamplingResult.from_bound(np.array([1, 2]), np.array([0.5, 0.8]), np.array([10, 10]))
        assert sampling.prediction.tolist() == [ABSTAIN, 2]
        certificates = certificates_from_sampling(sampling, np.array([1.0, 1.0]), region=np.array([4, 5]))
        assert certificates.radius[0] == 0.0
        assert certificates.radius[1] == pytest.approx(stats.norm.ppf(0.8))
        assert certificates.region.tolist() == [4, 5]


def crowded_groups(w, n_groups, per_group, seed):
    """Isolated groups of inputs crowded along ``w``: balls of radius ~``|w . x|`` overlap within a group only.

    Group ``g`` holds ``per_group`` inputs spread along ``w`` (``w . x`` in
    [-2, 2]) and packed across it (0.05 of noise), shifted by a distinct
    corner of a cube of side 20 in the directions orthogonal to ``w`` and to
    the first coordinate: groups lie at least 20 - 1 apart, further than any
    two radii reach, and their ``z = w . x + b`` and first coordinates do not
    depend on the shift.

    Returns
    -------
    X : ndarray of float32, shape (n_groups * per_group, len(w))
        Group after group.
    """
    rng = np.random.default_rng(seed)
    dim = len(w)
    basis, _ = np.linalg.qr(np.column_stack([np.eye(dim)[0], w, rng.standard_normal((dim, dim - 2))]))
    corners = np.array(list(itertools.product((0.0, 20.0), repeat=dim - 2)))[:n_groups]
    shift = corners @ basis[:, 2:].T
    along = rng.uniform(-2, 2, (n_groups, per_group))
    X = along[..., None] * w + 0.05 * rng.standard_normal((n_groups, per_group, dim)) + shift[:, None]
    return X.reshape(-1, dim).astype(np.float32)


@pytest.mark.parametrize("allocator", ALLOCATORS, ids=repr)
def test_soundness_linear_model_crowded(allocator):
    """Certified radius never above the true radius |z| (no wrong class), but with probability alpha.

    100 isolated groups of 15 inputs (:func:`crowded_groups`): within a group
    the balls overlap heavily; no region reaches another group, and rows draw
    independent noise. A group fails when one of its certificates does. The
    allocation of a group depends on its own samples only, so each group's
    failure lies in an event of its own samples (its inputs' reported
    certificates failing; for the LP allocator, which caps first-pass
    certificates, their first passes failing) of probability at most
    15 * alpha (union bound), independent across groups: the failed groups
    exceed the binomial quantile at error probability 1e-6 with probability
    at most 1e-6.
    """
    dim, n_groups, per_group, alpha, n = 10, 100, 15, 1e-4, 400
    clf, w = linear_estimator(allocator, dim, alpha=alpha, n=n)
    X = crowded_groups(w, n_groups, per_group, seed=10)
    labels, radius, details = clf.certify(X, return_details=True)
    z = X.astype(np.float64) @ w + 0.1
    wrong = (labels != ABSTAIN) & ((labels != (z > 0)) | (radius > np.abs(z)))
    assert wrong.reshape(n_groups, per_group).any(axis=1).sum() <= stats.binom.isf(1e-6, n_groups, per_group * alpha)
    assert np.mean(radius > 0) > 0.5
    if isinstance(allocator, NoRegions):
        return
    np.testing.assert_array_equal(details.sigma, clf.regions_.sigmas[details.region])
    if isinstance(allocator, MemoryAllocator):
        other = clf.regions_.predictions[:, None] != clf.regions_.predictions[None, :]
        assert_disjoint(clf.regions_, mask=other)
        return
    assert_disjoint(clf.regions_)
    _, alone = linear_estimator(NoRegions(), dim, alpha=alpha, n=n)[0].certify(X)
    assert np.mean(radius < alone) > 0.5  # regions shrank most certificates
    if isinstance(allocator, OnlineBallAllocator):
        assert len(clf.regions_) < 2 * len(X) // 3  # many inputs joined a ball
        assert np.any(details.n_samples == 2 * (n + 50))  # some were re-certified at their ball's sigma


class NoiseEnergy(torch.nn.Module):
    """Class 1 when the mean square of the (noisy) input exceeds ``threshold``: reveals the sigma used."""

    def __init__(self, threshold=0.25):
        super().__init__()
        self.threshold = threshold
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        energy = x.flatten(1).pow(2).mean(dim=1) - self.threshold
        return torch.stack([-energy, energy], dim=1) + 0 * self.unused


@pytest.mark.parametrize("allocator", ALLOCATORS[1:], ids=repr)
def test_predict_smooths_with_region_sigma(allocator):
    """An input inside a region is smoothed with the region's sigma, not its searched one."""
    dim = 64
    clf = SampleWiseSmoothedClassifier(
        NoiseEnergy(threshold=0.2), max_epochs=0, sigma_search=FirstCoordinateSigma(0.3, 0.6),
        sampler=FixedSampler(n=200, n0=20), allocator=allocator, random_state=0)
    clf.fit(np.zeros((2, dim), dtype=np.float32), np.array([0, 1]))
    anchor = np.zeros((1, dim), dtype=np.float32)
    anchor[0, 0] = 0.01  # searched sigma 0.6: energy 0.36 > 0.2, class 1, large radius
    near = anchor.copy()
    near[0, 0] = -0.01  # searched sigma 0.3 alone: energy 0.09, class 0
    assert clf.predict(near).tolist() == [0]
    clf.certify(anchor)
    assert clf.predict(near).tolist() == [1]
    assert clf.reset_regions().predict(near).tolist() == [0]
