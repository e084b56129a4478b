"""Tests of ``smoothsk.regions.RegionStore``: its rows, its call counter, and its life inside a saved estimator.

Which weights, allocator and alpha a store belongs to is tested in ``test_regions_lifetime.py``.
"""

import joblib
import numpy as np
import pytest

from smoothsk.regions import RegionStore

from regions_support import ALLOCATORS, Oracle, linear_estimator


class TestRegionStore:
    def test_append_returns_indices_and_keeps_dtypes(self):
        store = RegionStore.empty(3)
        assert len(store) == 0 and store.centres.shape == (0, 3)
        first = store.append(np.ones((2, 3)), [0.5, 1.0], [0.25, 0.25], [1, 2], [0.9, 0.99])
        second = store.append(np.zeros((1, 3)), [2.0], [0.5], [0], [0.999])
        assert first.tolist() == [0, 1] and second.tolist() == [2] and len(store) == 3
        assert store.centres.dtype == np.float32 and store.predictions.dtype == np.int64
        assert store.radii.tolist() == [0.5, 1.0, 2.0]

    @pytest.mark.parametrize("allocator", ALLOCATORS[1:], ids=repr)
    def test_every_allocation_samples_at_stages_of_a_new_call(self, allocator):
        """Each allocate call counts itself on the store; its sampling stages carry that count alone.

        Stages shared with an earlier call would reuse the noise that shaped the stored
        regions (noise is keyed by the input's values), so two calls on the same inputs
        must sample at disjoint stages.
        """
        rng = np.random.default_rng(0)
        X = rng.standard_normal((6, 4)).astype(np.float32)
        X[3] = X[0]
        store = RegionStore.empty(4)
        for call in (1, 2, 3):
            oracle = Oracle(np.full(6, 0.3), np.zeros(6, dtype=int))
            allocator.allocate(store, X * call, np.full(6, 0.5), oracle)  # new inputs: every call samples
            assert store.n_calls == call
            assert oracle.calls and {c["stage"][-1] for c in oracle.calls} == {call}


@pytest.mark.parametrize("allocator", ALLOCATORS[1:], ids=repr)
def test_persistence_reset_and_reuse(allocator, tmp_path):
    dim = 10
    clf, _ = linear_estimator(allocator, dim, alpha=1e-3, n=500)
    rng = np.random.default_rng(11)
    X = (rng.standard_normal((40, dim)) * 0.4).astype(np.float32)
    _, _, first = clf.certify(X, return_details=True)
    n_regions = len(clf.regions_)
    joblib.dump(clf, tmp_path / "clf.joblib")
    loaded = joblib.load(tmp_path / "clf.joblib")
    for field in ("centres", "radii", "sigmas", "predictions", "p_lowers"):
        np.testing.assert_array_equal(getattr(loaded.regions_, field), getattr(clf.regions_, field))
    assert loaded.regions_.n_calls == 1
    # a second call on the same inputs reuses their regions and opens none
    _, _, again = loaded.certify(X, return_details=True)
    assert len(loaded.regions_) == n_regions
    np.testing.assert_array_equal(again.region, first.region)
    np.testing.assert_array_equal(again.sigma, first.sigma)
    assert len(loaded.reset_regions().regions_) == 0 and loaded.regions_.n_calls == 0
    assert len(clf.regions_) == n_regions  # the original is untouched
