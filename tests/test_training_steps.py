"""The training steps: per-sample noise in skorch's hooks, and a diverging training stopped where it diverges."""

import numpy as np
import pytest
import torch

from smoothsk import SampleWiseSmoothedClassifier

from conftest import tiny_digits_classifier


class NaNAfter(torch.nn.Module):
    """Linear logits over the flattened input, NaN from the ``first_nan``-th training call on (1-based)."""

    def __init__(self, first_nan=3):
        super().__init__()
        self.linear = torch.nn.Linear(64, 10)
        self.first_nan = first_nan
        self.calls = 0

    def forward(self, x):
        self.calls += self.training
        logits = self.linear(x.flatten(1))
        return logits * float("nan") if self.training and self.calls >= self.first_nan else logits


class TestNonFiniteLoss:
    def test_a_diverging_training_stops_at_its_first_non_finite_loss(self, digits_split):
        X_train, y_train, _, _ = digits_split
        clf = SampleWiseSmoothedClassifier(NaNAfter, max_epochs=3, lr=0.05, batch_size=32, random_state=0)
        with pytest.raises(FloatingPointError, match=r"^The training loss is nan at epoch 1, batch 3 "
                                                     r"\(FixedSigmaTraining, objective GaussianNoise\): .*"
                                                     r"learning rate \(now 0.05; lr=0.05\)"):
            clf.fit(X_train, y_train)
        # Stopped in the batch that diverged: two batches recorded before it, no epoch ended.
        assert len(clf.history_) == 1 and "train_loss" not in clf.history_[-1]
        assert [("train_loss" in batch) for batch in clf.history_[-1]["batches"]] == [True, True, False]

    def test_a_diverging_learning_rate_is_caught(self, digits_split):
        X_train, y_train, _, _ = digits_split
        with pytest.raises(FloatingPointError, match=r"^The training loss is nan at epoch 1, batch \d+ "):
            tiny_digits_classifier(lr=1e6, max_epochs=3).fit(X_train, y_train)

    def test_a_finite_training_is_untouched(self, digits_split):
        X_train, y_train, _, _ = digits_split
        clf = tiny_digits_classifier(max_epochs=1).fit(X_train, y_train)
        assert np.isfinite(clf.history_[-1]["train_loss"])
