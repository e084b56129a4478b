"""The contract every test-time noise-level search keeps (smoothsk.sigma._base): soundness and its own noise."""

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.exceptions import NotFittedError

from smoothsk import ABSTAIN
from smoothsk._stages import SEARCH_STAGE
from smoothsk.sigma import CertifiedSigmaSelector, FixedSigma, GradientSigmaSearch, GridSigmaSearch, MultiStartFGSS
from smoothsk.sigma._base import BaseSigmaSearch, SigmaSearchResult

from conftest import SEARCH_WEIGHT, LinearLogits, StageSpy, linear_engine

SEARCHES = [
    GridSigmaSearch(),
    MultiStartFGSS(),
    MultiStartFGSS(per_input=False),
    MultiStartFGSS(score="certified", n=200),
    GradientSigmaSearch(steps=20, lr=0.05, n=4, sigma_max=2.0),
]


@pytest.mark.parametrize("search", SEARCHES, ids=lambda s: repr(s))
def test_certificates_stay_sound_with_each_search(linear_data, make_linear_classifier, search):
    """Certified radius above the true radius (or a wrong class) at most at rate alpha.

    Each input's certificate fails with probability <= alpha whatever sigma the
    search picked, provided the search noise is independent of the
    certification samples. The count of failures is then dominated by
    Binomial(300, alpha); the test fails with probability < 1e-6 when sound.
    """
    X, y, true_radius = linear_data
    alpha = 0.05
    prediction, radius, details = make_linear_classifier(
        SEARCH_WEIGHT, n=500, n0=50, alpha=alpha, sigma_search=search).certify(X, return_details=True)
    failed = (prediction != ABSTAIN) & ((prediction != y) | (radius > true_radius))
    assert failed.sum() <= stats.binom.isf(1e-6, len(X), alpha)
    assert details.search_steps.shape == (len(X),) and (details.search_steps > 0).all()
    assert (details.sigma > 0).all()


@pytest.mark.parametrize("search", SEARCHES, ids=lambda s: repr(s))
def test_searches_draw_only_search_stage_noise(linear_data, search):
    """Certification uses stages (1, ...); a search must never read those samples."""
    engine = StageSpy(LinearLogits(SEARCH_WEIGHT).eval(), 2, 1000)
    engine.stages = []
    search.search(engine.restricted(np.arange(20)), torch.from_numpy(linear_data[0][:20]))
    assert engine.stages and all(stage[0] == SEARCH_STAGE for stage in engine.stages)


@pytest.mark.parametrize("search, levels", [
    (GridSigmaSearch(0.1, 0.45, step=0.1, n=50), [0.1, 0.2, 0.3, 0.4]),
    (MultiStartFGSS(sigma0=0.5, max_level=4, n=50), [0.5, 0.5 * np.sqrt(2), 0.5 * np.sqrt(3), 1.0]),
    (MultiStartFGSS(sigma0=0.5, max_level=4, n=50, per_input=False), [0.5, 0.5 * np.sqrt(2), 0.5 * np.sqrt(3), 1.0]),
    (FixedSigma(0.3), [0.3]),
], ids=lambda value: repr(value) if not isinstance(value, list) else "")
def test_noise_levels_are_what_the_search_chooses_among(linear_data, search, levels):
    np.testing.assert_allclose(search.noise_levels(), levels, rtol=1e-12)
    chosen = search.search(linear_engine(), torch.from_numpy(linear_data[0][:40])).sigma
    assert np.isclose(chosen[:, None], search.noise_levels()[None, :], rtol=1e-12, atol=0).any(axis=1).all()


def test_a_continuous_search_has_no_noise_levels():
    assert GradientSigmaSearch().noise_levels() is None


class ReturnsForFirstInput(BaseSigmaSearch):
    """A search answering ``sigma`` for the first input and 0.5 for the others (a user's, or one gone wrong)."""

    def __init__(self, sigma=0.5):
        self.sigma = sigma

    def _search(self, engine, X, y):
        sigma = np.full(len(X), 0.5)
        sigma[0] = self.sigma
        return SigmaSearchResult(sigma, np.ones(len(X), dtype=np.int64))


@pytest.mark.parametrize("sigma", [np.nan, 0.0, -0.5, np.inf])
def test_a_sigma_that_is_not_finite_and_positive_is_refused_naming_the_search(sigma):
    engine = StageSpy(LinearLogits(SEARCH_WEIGHT).eval(), 2, 1000)
    with pytest.raises(ValueError, match=rf"ReturnsForFirstInput\(sigma={sigma}\) chose sigma={sigma} for an input; "
                                         r"a noise level must be finite and positive"):
        ReturnsForFirstInput(sigma).search(engine, torch.zeros((3, 4)))


@pytest.mark.parametrize("as_tensor", [False, True])
def test_fitted_state_compares_arrays_by_value(as_tensor):
    # 1001 levels: numpy and torch summarise the middle of the repr, where the two differ.
    levels = np.linspace(0.1, 2.0, 1001)
    changed = levels.copy()
    changed[500] += 0.01
    wrap = torch.from_numpy if as_tensor else np.asarray
    fitted = CertifiedSigmaSelector(levels=wrap(levels))
    assert repr(CertifiedSigmaSelector(levels=wrap(changed))) == repr(fitted)
    with pytest.raises(NotFittedError, match=r"\['levels'\] changed since fit"):
        CertifiedSigmaSelector(levels=wrap(changed)).with_fitted_state(fitted)
    assert CertifiedSigmaSelector(levels=wrap(levels.copy()), n=7).with_fitted_state(fitted).n == 7
