"""skorch's hooks of one training epoch, for training with per-sample noise.

:class:`NoisyTrainingSteps` is mixed into the estimator before skorch's
``NeuralNet``: the data become an indexed dataset (each item's position keys
its training sigma), batches are tensor slices, and each step's loss is the
training schedule's objective on noisy copies with each sample's sigma.
"""

import torch
from skorch.dataset import Dataset as SkorchDataset
from torch.utils.data import DataLoader, Dataset

from ._data import IndexedTensorDataset, TensorBatches
from .training._sigma_timer import SigmaTimer

__all__ = ["NoisyTrainingSteps", "check_iterator_options"]


def check_iterator_options(estimator):
    """Refuse a ``dataset`` and ``iterator_train__*``/``iterator_valid__*`` options the training would ignore.

    Parameters
    ----------
    estimator : SampleWiseSmoothedClassifier

    Raises
    ------
    ValueError
        Naming the first such option.
    """
    if estimator.dataset is not SkorchDataset or estimator.get_params_for("dataset"):
        raise ValueError("dataset is not used: smoothsk trains on its own indexed dataset of X and y (each "
                         "item's position keys its training sigma); leave dataset and dataset__* at their "
                         "defaults.")
    for prefix in ("iterator_train", "iterator_valid"):
        if getattr(estimator, prefix) is not DataLoader:
            continue  # a custom iterator gets every option (skorch's get_iterator)
        ignored = sorted(set(estimator.get_params_for(prefix)) - set(TensorBatches.OPTIONS))
        if ignored:
            raise ValueError(f"{prefix}__{ignored[0]} is not an option of smoothsk's training batches, which "
                             f"slice the tensors in memory and take only {', '.join(TensorBatches.OPTIONS)}; "
                             f"for DataLoader's other options set {prefix} to a DataLoader subclass.")


def _diverged(estimator, loss):
    """The one-line error of a training step whose loss is not finite: where, which training, what to change."""
    epoch = len(estimator.history)
    batch = len(estimator.history[-1]["batches"])  # skorch opened this batch's record before the step
    training = estimator.training_
    rate = estimator.optimizer_.param_groups[0]["lr"]  # the live rate, after any scheduler
    return (f"The training loss is {loss.item()} at epoch {epoch}, batch {batch} ({type(training).__name__}, "
            f"objective {type(training.objective_).__name__}): the training diverged, and fit stopped at its first "
            f"non-finite loss. Lower the learning rate (now {rate:g}; lr={estimator.lr:g}) or the objective's "
            f"weights (such as Consistency's lbd), or clip the gradients (skorch's GradientNormClipping callback).")


class NoisyTrainingSteps:
    """skorch's ``get_*`` and step hooks for per-sample noise; reads ``training_`` (the run's schedule)."""

    def get_dataset(self, X, y=None):
        """Training tensors as an indexed dataset (items ``(x, y, position)``)."""
        if isinstance(X, Dataset):
            return X
        return IndexedTensorDataset(torch.as_tensor(X), None if y is None else torch.as_tensor(y))

    def get_iterator(self, dataset, training=False):
        """Batches by tensor slicing; a custom ``iterator_train``/``iterator_valid`` is honoured."""
        iterator = self.iterator_train if training else self.iterator_valid
        if iterator is not DataLoader:
            return super().get_iterator(dataset, training)
        kwargs = self.get_params_for("iterator_train" if training else "iterator_valid")
        shuffle = kwargs.get("shuffle", training)
        return TensorBatches(dataset, kwargs.get("batch_size", self.batch_size), shuffle,
                              getattr(self, "shuffle_generator_", None), kwargs.get("drop_last", False))

    def _batch_loss(self, batch):
        X, y, index = (part.to(self.device) for part in batch)
        sigma = self.training_.batch_sigma(self, X, y, index)
        return self.training_.objective_.loss(self, X, y, sigma)

    def train_step_single(self, batch, **fit_params):
        """Loss on noisy copies with each sample's sigma; backward.

        Returns
        -------
        dict
            ``{'loss': loss, 'y_pred': logits on one noisy copy per sample}``.
        """
        self._set_training(True)
        loss, logits = self._batch_loss(batch)
        if not torch.isfinite(loss):  # skorch reads the loss on the host after each step anyway
            raise FloatingPointError(_diverged(self, loss))
        loss.backward()
        return {"loss": loss, "y_pred": logits}

    def validation_step(self, batch, **fit_params):
        """Validation loss under the same per-sample noise as training.

        Returns
        -------
        dict
            ``{'loss': loss, 'y_pred': logits}``.
        """
        self._set_training(False)
        with torch.no_grad():
            loss, logits = self._batch_loss(batch)
        return {"loss": loss, "y_pred": logits}

    def get_default_callbacks(self):
        """skorch's default callbacks after :class:`~smoothsk.training._sigma_timer.SigmaTimer` (``sigma_time``)."""
        return [("sigma_timer", SigmaTimer()), *super().get_default_callbacks()]

    def on_epoch_begin(self, net, dataset_train=None, dataset_valid=None, **kwargs):
        """Let the training schedule update per-sample sigmas before each epoch."""
        super().on_epoch_begin(net, dataset_train, dataset_valid, **kwargs)
        self.training_.on_epoch_begin(self)
