"""The training steps: per-sample noise in skorch's hooks, and a diverging training stopped where it diverges."""

import numpy as np
import pytest

from conftest import tiny_digits_classifier


class TestNonFiniteLoss:
    def test_a_diverging_training_stops_at_its_first_non_finite_loss(self, digits_split):
        X_train, y_train, _, _ = digits_split
        clf = tiny_digits_classifier(lr=1e6, max_epochs=3)
        with pytest.raises(FloatingPointError, match=r"^The training loss is nan at epoch 1, batch \d+ "
                                                     r"\(FixedSigmaTraining, objective GaussianNoise\): .*lr=1e\+06"):
            clf.fit(X_train, y_train)
        # No epoch ended: fit stopped in the first one, not after training on NaN.
        assert len(clf.history_) == 1 and "train_loss" not in clf.history_[-1]

    def test_a_finite_training_is_untouched(self, digits_split):
        X_train, y_train, _, _ = digits_split
        clf = tiny_digits_classifier(max_epochs=1).fit(X_train, y_train)
        assert np.isfinite(clf.history_[-1]["train_loss"])
