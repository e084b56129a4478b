"""Per-sample training sigmas across fit calls: they follow the samples, under the schedule that set them."""

import numpy as np
import pytest

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.sigma import GridSigmaSearch
from smoothsk.training import (
    DataDependentTraining,
    FixedSigmaTraining,
    GaussianNoise,
    InstaRSTrain,
    PretrainFinetune,
)
from smoothsk.training._per_sample import matched_rows

from training_support import digits_net, training_digits


class FailingOnce(GridSigmaSearch):
    """PFAT's grid search, failing (like a CUDA out-of-memory error) at the next call after ``fail_next`` is set."""

    fail_next = False

    def _search(self, engine, X, y):
        if FailingOnce.fail_next:
            FailingOnce.fail_next = False
            raise RuntimeError("CUDA out of memory")
        return super()._search(engine, X, y)


def assigned_net(X, y):
    """A PFAT-trained net whose finetuning is done, its sigmas assigned per sample."""
    schedule = PretrainFinetune(pretrain_epochs=1, finetune_epochs=1, objective=GaussianNoise(),
                                assignment=GridSigmaSearch(0.12, 0.5, 0.05, n=50))
    net = digits_net(X, y, training=schedule)
    assert len(np.unique(net.train_sigmas_)) > 1
    return net


def test_sigmas_follow_the_samples_in_another_order():
    X, y = training_digits()
    net = assigned_net(X[:100], y[:100])
    assigned = net.train_sigmas_.copy()
    order = np.random.default_rng(0).permutation(100)
    net.partial_fit(X[order], y[order])
    np.testing.assert_array_equal(net.train_sigmas_, assigned[order])
    assert net.history[-1, "sigma_time"] == 0  # every sample known: nothing searched again


def test_new_samples_get_their_own_sigmas_and_known_ones_keep_theirs(tmp_path):
    # Half of a same-sized training set is new: the known half keeps its sigmas (now in other
    # rows), the new half is assigned by the search; also after a save and load.
    X, y = training_digits()
    net = assigned_net(X[:100], y[:100])
    assigned = net.train_sigmas_.copy()
    net.save(tmp_path / "net.safetensors")
    for resumed in (net, SampleWiseSmoothedClassifier.load(tmp_path / "net.safetensors")):
        resumed.partial_fit(X[50:150], y[50:150])
        np.testing.assert_array_equal(resumed.train_sigmas_[:50], assigned[50:])
        assert resumed.history[-1, "sigma_time"] > 0
        assert np.all(np.isin(resumed.train_sigmas_[50:], GridSigmaSearch(0.12, 0.5, 0.05).grid_sigmas()))


@pytest.mark.parametrize("schedule, start", [
    (InstaRSTrain(sigma0=0.25, update_every=10, stage1_epochs=2, stage2_epochs=0, num_noise=2,
                  stage1_objective=GaussianNoise(), stage2_objective=GaussianNoise()), 0.25),
    (InstaRSTrain(sigma0=0.25, max_level=4, stage1_epochs=0, stage2_epochs=1,
                  stage1_objective=GaussianNoise(), stage2_objective=GaussianNoise()), 0.25),
    (DataDependentTraining(sigma_init=0.25, warmup_epochs=5), 0.25),
], ids=["insta-rs stage I", "insta-rs stage II, max_level 4", "data-dependent warm-up"])
def test_another_schedule_starts_every_sample_at_its_own_initial_sigma(schedule, start):
    # The sigmas of FixedSigmaTraining(2.0) are not levels of Insta-RS nor DDRS's starting point.
    X, y = training_digits()
    net = digits_net(X[:100], y[:100], training=FixedSigmaTraining(2.0), max_epochs=1)
    net.set_params(training=schedule).partial_fit(X[:100], y[:100])
    np.testing.assert_array_equal(net.train_sigmas_, np.full(100, start))


def test_repeated_inputs_are_matched_in_order():
    # The k-th repeat of a key takes the sigma of the k-th one; a repeat beyond those known is new.
    old = np.array([5, 7, 5], dtype=np.uint64)
    new = np.array([5, 5, 5, 9, 7], dtype=np.uint64)
    np.testing.assert_array_equal(matched_rows(old, new), [0, 2, -1, -1, 1])


def test_a_failed_assignment_leaves_the_new_samples_unassigned():
    # The search for the new half fails: a retry searches it, it does not finetune it at the placeholder.
    X, y = training_digits()
    schedule = PretrainFinetune(pretrain_epochs=1, finetune_epochs=1, objective=GaussianNoise(),
                                assignment=FailingOnce(0.12, 0.5, 0.05, n=50))
    net = digits_net(X[:100], y[:100], training=schedule)
    FailingOnce.fail_next = True
    with pytest.raises(RuntimeError, match="out of memory"):
        net.partial_fit(X[:200], y[:200])
    net.partial_fit(X[:200], y[:200])
    assert net.history[-1, "sigma_time"] > 0
    assert np.all(np.isin(net.train_sigmas_[100:], GridSigmaSearch(0.12, 0.5, 0.05).grid_sigmas()))


def test_a_sample_is_its_input_and_its_label():
    # PFAT's assignment searches with the label: an input under a new label is a new sample, and two
    # rows of one input under two labels keep their own sigmas when swapped.
    X, y = training_digits()
    X, y = X[:100].copy(), y[:100].copy()
    X[1::2], y[1::2] = X[::2], (y[::2] + 5) % 10
    net = assigned_net(X, y)
    assigned = net.train_sigmas_.copy()
    assert np.any(assigned[::2] != assigned[1::2])
    swapped = np.arange(100).reshape(50, 2)[:, ::-1].reshape(-1)
    net.partial_fit(X[swapped], y[swapped])
    np.testing.assert_array_equal(net.train_sigmas_, assigned[swapped])
    assert net.history[-1, "sigma_time"] == 0
    net.partial_fit(X[swapped], (y[swapped] + 1) % 10)
    assert net.history[-1, "sigma_time"] > 0


def test_numpy_typed_sigma_parameters_keep_the_sigmas_through_save_and_load(tmp_path):
    # A value from np.linspace (a grid search's) is saved as a Python number: the keys stay the same.
    X, y = training_digits()
    schedule = InstaRSTrain(sigma0=np.linspace(0.125, 0.25, 2)[1], max_level=np.int64(4), stage1_epochs=1,
                            stage2_epochs=1, num_noise=2, stage1_objective=GaussianNoise(),
                            stage2_objective=GaussianNoise())
    digits_net(X[:100], y[:100], training=schedule).save(tmp_path / "net.safetensors")
    loaded = SampleWiseSmoothedClassifier.load(tmp_path / "net.safetensors")
    loaded.partial_fit(X[:100], y[:100])
    assert [row["training_stage"] for row in loaded.history] == ["stage1", "stage2", "stage2"]


def test_a_file_saved_before_keys_existed_keeps_its_sigmas_by_row(tmp_path):
    # Such a file has train_sigmas_ but no train_keys_: a training set of its length keeps them by row.
    X, y = training_digits()
    net = assigned_net(X[:100], y[:100])
    del net.train_keys_
    net.save(tmp_path / "old.safetensors")
    loaded = SampleWiseSmoothedClassifier.load(tmp_path / "old.safetensors")
    loaded.partial_fit(X[:100], y[:100])
    np.testing.assert_array_equal(loaded.train_sigmas_, net.train_sigmas_)
    assert loaded.history[-1, "sigma_time"] == 0
    order = np.random.default_rng(0).permutation(100)  # and from then on they follow the samples
    loaded.partial_fit(X[order], y[order])
    np.testing.assert_array_equal(loaded.train_sigmas_, net.train_sigmas_[order])
