"""A region store belongs to the weights, alpha, precision and allocator class it was made with; other ones clear or
refuse it."""

import numpy as np
import pytest
import torch

from smoothsk import ABSTAIN, SampleWiseSmoothedClassifier
from smoothsk.engine import MonteCarloEngine
from smoothsk.regions import MemoryAllocator, NoRegions, OnlineBallAllocator, RegionStore, TransductiveLPAllocator
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import FixedSigma
from smoothsk.training import FixedSigmaTraining

REGION_ALLOCATORS = [OnlineBallAllocator(), TransductiveLPAllocator(), MemoryAllocator()]


def linear_digits_classifier(allocator):
    module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    return SampleWiseSmoothedClassifier(
        module, training=FixedSigmaTraining(0.25), sigma_search=FixedSigma(0.25), sampler=FixedSampler(n=200, n0=20),
        allocator=allocator, max_epochs=8, lr=0.5, batch_size=100, certify_batch_size=4000, random_state=0)


def test_training_clears_regions_and_answers_follow_new_weights(digits):
    """After partial_fit on shifted labels no stored answer survives: certify and predict follow the new weights.

    On the unfixed code the second certification returned the first one bit
    for bit (stored answers of the old weights) and ``predict`` contradicted it.
    """
    X, y = digits
    X_train, y_train, X_test = X[:400], y[:400], X[1000:1020]
    clf = linear_digits_classifier(MemoryAllocator()).fit(X_train, y_train)
    first, _ = clf.certify(X_test)
    assert len(clf.regions_) == 20
    for _ in range(3):
        clf.partial_fit(X_train, (y_train + 1) % 10)
    assert len(clf.regions_) == 0
    second, _ = clf.certify(X_test)
    assert np.mean(second == first) < 0.5  # the retrained model answers otherwise
    predicted = clf.predict(X_test)
    both = (second != ABSTAIN) & (predicted != ABSTAIN)
    assert both.sum() >= 10
    np.testing.assert_array_equal(predicted[both], second[both])


@pytest.mark.parametrize("allocator", REGION_ALLOCATORS, ids=repr)
def test_any_training_clears_regions(allocator, make_linear_classifier):
    clf = make_linear_classifier([1.0, -1.0], n=100, n0=10, allocator=allocator)
    X = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    for train in (lambda: clf.partial_fit(X, [1, 0]), lambda: clf.set_params(warm_start=True).fit(X, [1, 0]),
                  lambda: clf.set_params(warm_start=False).fit(X, [1, 0])):
        clf.certify(X)
        assert len(clf.regions_) > 0
        train()
        assert len(clf.regions_) == 0


@pytest.mark.parametrize("allocator", REGION_ALLOCATORS, ids=repr)
def test_refuses_regions_of_other_weights(allocator, make_linear_classifier):
    """Weights edited or loaded by hand: certify and predict refuse the store until reset_regions()."""
    clf = make_linear_classifier([1.0, -1.0], n=100, n0=10, allocator=allocator)
    X = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    before, _ = clf.certify(X)
    clf.predict(X)  # the weights that made the store
    with torch.no_grad():
        clf.module_.weight.neg_()
    for method in (clf.certify, clf.predict, clf.predict_proba):
        with pytest.raises(ValueError, match=r"other module weights.*reset_regions\(\)"):
            method(X)
    after, _ = clf.reset_regions().certify(X)
    np.testing.assert_array_equal(after, 1 - before)


class Flipped(torch.nn.Module):
    """Wraps a module and multiplies its logits by a buffer kept out of the state_dict (+1 or -1)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.register_buffer("sign", torch.ones(()), persistent=False)

    def forward(self, x):
        return self.sign * self.inner(x)


@pytest.mark.parametrize("allocator", REGION_ALLOCATORS, ids=repr)
def test_refuses_regions_of_a_module_changed_outside_its_weights(allocator, make_linear_classifier):
    """A buffer outside the state_dict changes what the module computes: the store is refused too."""
    clf = make_linear_classifier([1.0, -1.0], n=100, n0=10, allocator=allocator)
    clf.module_ = Flipped(clf.module_).eval()
    X = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    before, _ = clf.reset_regions().certify(X)
    with torch.no_grad():
        clf.module_.sign.fill_(-1.0)  # same state_dict, opposite classes
    for method in (clf.certify, clf.predict):
        with pytest.raises(ValueError, match=r"other module weights.*reset_regions\(\)"):
            method(X)
    after, _ = clf.reset_regions().certify(X)
    np.testing.assert_array_equal(after, 1 - before)


@pytest.mark.parametrize("first, second", [(OnlineBallAllocator(), MemoryAllocator()),
                                           (MemoryAllocator(), TransductiveLPAllocator()),
                                           (TransductiveLPAllocator(), NoRegions())], ids=repr)
def test_refuses_another_allocator_class_on_a_non_empty_store(first, second, make_linear_classifier):
    clf = make_linear_classifier([1.0, -1.0], n=100, n0=10, allocator=first)
    X = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    clf.certify(X)
    n_regions = len(clf.regions_)
    clf.set_params(allocator=second)
    for method in (clf.certify, clf.predict):
        with pytest.raises(ValueError, match=rf"{type(first).__name__}.*{type(second).__name__}.*reset_regions\(\)"):
            method(X)
    assert len(clf.regions_) == n_regions
    clf.reset_regions().certify(X)
    # another instance of the same class is welcome
    clf.set_params(allocator=type(second)())
    clf.certify(X)


@pytest.mark.parametrize("allocator", REGION_ALLOCATORS, ids=repr)
def test_a_store_made_at_another_alpha_is_refused_or_cleared(allocator, make_linear_classifier):
    """alpha is part of the store's owner: assigned directly it is refused, set_params starts a new store."""
    clf = make_linear_classifier([1.0, -1.0], n=100, n0=10, alpha=0.01, allocator=allocator)
    X = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    clf.certify(X)
    n_calls = clf.regions_.n_calls
    clf.alpha = 0.001
    for method in (clf.certify, clf.predict):
        with pytest.raises(ValueError, match=r"alpha=0\.01.*alpha is now 0\.001.*reset_regions\(\)"):
            method(X)
    clf.alpha = 0.01
    clf.certify(X)  # back at the store's alpha
    assert clf.regions_.n_calls == n_calls + 1
    with pytest.warns(UserWarning, match=r"alpha changed from 0\.01 to 0\.001.*cleared"):
        clf.set_params(alpha=0.001)
    assert len(clf.regions_) == 0
    clf.certify(X)
    assert clf.regions_.alpha == 0.001 and len(clf.regions_) > 0
    clf.set_params(alpha=0.001)  # the same alpha keeps the store
    assert len(clf.regions_) > 0


class BoundaryNearOne(torch.nn.Module):
    """Class 1 where ``x[0] < 1.003``, from one Linear layer (which ``torch.autocast`` runs in bfloat16).

    In bfloat16 the bias 1.003 rounds to 1.0 and the input 1.0015 to 1.0: the
    float32 module says class 1 at ``x = 1.0015``, the bfloat16 one class 0.
    """

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(1, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor([[1.0], [-1.0]]))
            self.lin.bias.copy_(torch.tensor([-1.003, 1.003]))

    def forward(self, x):
        return self.lin(x[:, :1])


@pytest.mark.parametrize("allocator", REGION_ALLOCATORS, ids=repr)
def test_a_store_made_in_another_precision_is_refused_or_cleared(allocator):
    """certify_autocast is part of the store's owner, as alpha: assigned directly it is refused, set_params clears.

    On main the store of the float32 module (region: class 1 around x = 1.0015) was kept
    after switching to bfloat16, whose smoothed classifier says class 0 there.
    """
    clf = SampleWiseSmoothedClassifier(
        BoundaryNearOne, training=FixedSigmaTraining(0.0005), sigma_search=FixedSigma(0.0005), allocator=allocator,
        sampler=FixedSampler(n=2000, n0=100), alpha=0.001, max_epochs=0, random_state=0)
    clf.fit(np.zeros((2, 1), np.float32), [0, 1])
    X = np.array([[1.0015]], np.float32)
    np.testing.assert_array_equal(clf.certify(X)[0], 1)
    n_calls = clf.regions_.n_calls
    clf.certify_autocast = "bfloat16"
    for method in (clf.certify, clf.predict):
        with pytest.raises(ValueError, match=r"certify_autocast=None.*certify_autocast is now 'bfloat16'.*"
                                             r"reset_regions\(\)"):
            method(X)
    clf.certify_autocast = None
    clf.certify(X)  # back in the store's precision
    assert clf.regions_.n_calls == n_calls + 1
    with pytest.warns(UserWarning, match=r"certify_autocast changed from None to 'bfloat16'.*cleared"):
        clf.set_params(certify_autocast="bfloat16")
    assert len(clf.regions_) == 0
    prediction, _ = clf.certify(X)
    np.testing.assert_array_equal(prediction, 0)  # the bfloat16 classifier's own class, no stored claim of 1
    np.testing.assert_array_equal(clf.predict(X), 0)
    assert clf.regions_.autocast == "bfloat16"
    clf.set_params(certify_autocast="bfloat16")  # the same precision keeps the store
    assert len(clf.regions_) > 0


@pytest.mark.parametrize("allocator", REGION_ALLOCATORS, ids=repr)
def test_a_failed_certify_leaves_the_store_as_it_was(allocator, make_linear_classifier, monkeypatch):
    """An error in a call's last sampling (out of memory, Ctrl-C) keeps nothing of the call: its rerun is the call."""
    X = (np.random.default_rng(1).normal(size=(2, 30, 2)) * 0.3 + [0.5, 0.5]).astype(np.float32)
    reference = make_linear_classifier([0.6, 0.8], 0.1, n=100, n0=10, allocator=allocator)
    reference.certify(X[0])
    calls = []
    original = MonteCarloEngine.class_counts
    monkeypatch.setattr(MonteCarloEngine, "class_counts", lambda *args: calls.append(1) or original(*args))
    expected = reference.certify(X[1])
    n_calls = len(calls)
    clf = make_linear_classifier([0.6, 0.8], 0.1, n=100, n0=10, allocator=allocator)
    clf.certify(X[0])
    before = clf.regions_.digest()

    def fail_on_the_last_call(*args):
        calls.append(1)
        if len(calls) == n_calls:
            raise RuntimeError("out of memory")
        return original(*args)

    calls.clear()
    monkeypatch.setattr(MonteCarloEngine, "class_counts", fail_on_the_last_call)
    with pytest.raises(RuntimeError, match="out of memory"):
        clf.certify(X[1])
    assert clf.regions_.digest() == before
    monkeypatch.setattr(MonteCarloEngine, "class_counts", original)
    for found, wanted in zip(clf.certify(X[1]), expected, strict=True):
        np.testing.assert_array_equal(found, wanted)


def test_digest_follows_contents():
    store = RegionStore.empty(3)
    empty = store.digest()
    store.append([[0, 0, 1]], [1.0], [0.5], [2], [0.9])
    grown = store.digest()
    assert grown != empty
    store.radii[0] = 0.5
    assert store.digest() != grown
    store.radii[0] = 1.0
    assert store.digest() == grown
    store.count_call()
    assert store.digest() != grown
    counted = store.digest()
    store.alpha = 0.01
    assert store.digest() != counted
    at_alpha = store.digest()
    store.autocast = "bfloat16"
    assert store.digest() != at_alpha


class ShiftedLogits(torch.nn.Module):
    """Binary classifier ``x[0] > shift`` whose boundary is a plain attribute, not a tensor."""

    def __init__(self, shift=0.0):
        super().__init__()
        self.shift = float(shift)
        self.unused = torch.nn.Parameter(torch.zeros(1))  # skorch's optimizer needs one

    def forward(self, x):
        z = x.flatten(1)[:, 0].double() - self.shift
        return torch.stack([-z, z], dim=1).float()


@pytest.mark.parametrize("allocator", REGION_ALLOCATORS, ids=repr)
def test_reinitialising_the_module_clears_regions(allocator):
    """set_params(module__...) builds a new model; the seeded rebuild can have the very same state_dict.

    On main the store survived (same weights fingerprint) and MemoryAllocator kept
    answering class 1 with radius ~1 at x = 0 for the model ``x[0] > 5``, which is class 0 there.
    """
    clf = SampleWiseSmoothedClassifier(
        ShiftedLogits, module__shift=-1.0, max_epochs=0, training=FixedSigmaTraining(0.5),
        sigma_search=FixedSigma(0.5), sampler=FixedSampler(n=200, n0=20), allocator=allocator, random_state=0)
    clf.fit(np.zeros((2, 2), dtype=np.float32), [0, 1])
    X = np.array([[0.0, 0.0], [0.0, 10.0]], dtype=np.float32)
    before, _ = clf.certify(X)
    np.testing.assert_array_equal(before, 1)
    clf.set_params(module__shift=5.0)
    assert len(clf.regions_) == 0
    after, _ = clf.certify(X)
    np.testing.assert_array_equal(after, 0)
    np.testing.assert_array_equal(clf.predict(X), 0)
