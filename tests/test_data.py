"""The estimator's tensor data pipeline: slicing batches and input identifiers."""

import numpy as np
import pytest
import torch
from torch.utils.data import Subset

from smoothsk._data import IndexedTensorDataset, TensorBatches, input_ids


def _dataset(n=10):
    return IndexedTensorDataset(torch.arange(n * 3, dtype=torch.float32).reshape(n, 3), torch.arange(n) % 2)


class TestTensorBatches:
    def test_an_epoch_visits_every_sample_once_with_its_label_and_position(self):
        dataset = _dataset()
        batches = TensorBatches(dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
        seen = []
        for X, y, index in batches:
            torch.testing.assert_close(X, dataset.X[index])
            torch.testing.assert_close(y, dataset.y[index])
            seen.extend(index.tolist())
        assert len(batches) == 3 and sorted(seen) == list(range(10))

    def test_a_subset_yields_its_own_positions_in_the_whole_dataset(self):
        batches = TensorBatches(Subset(_dataset(), [7, 2, 5]), batch_size=-1, shuffle=False, generator=None)
        (_, _, index), = list(batches)
        assert index.tolist() == [7, 2, 5]

    def test_the_shuffle_follows_the_generator(self):
        def order(seed):
            batches = TensorBatches(_dataset(), 10, shuffle=True, generator=torch.Generator().manual_seed(seed))
            return next(iter(batches))[2].tolist()

        assert order(3) == order(3) and order(3) != order(4)

    @pytest.mark.parametrize("shuffle", [False, True])
    def test_drop_last_drops_the_short_batch(self, shuffle):
        batches = TensorBatches(_dataset(), 4, shuffle, torch.Generator().manual_seed(0), drop_last=True)
        assert len(batches) == 2 and [len(index) for _, _, index in batches] == [4, 4]

    def test_inputs_without_labels_come_alone(self):
        batches = TensorBatches(IndexedTensorDataset(torch.zeros(5, 2), None), 2, shuffle=False, generator=None)
        assert [len(batch) for batch in batches] == [2, 2, 2] and all(y is None for _, y in batches)


class TestInputIds:
    def test_an_input_keeps_its_id_wherever_it_is(self):
        X = np.random.default_rng(0).normal(size=(6, 2, 3)).astype(np.float32)
        ids = input_ids(X)
        np.testing.assert_array_equal(input_ids(X[::-1]), ids[::-1])
        np.testing.assert_array_equal(input_ids(X[[4]]), ids[[4]])

    def test_distinct_inputs_get_distinct_ids(self):
        X = np.zeros((2, 4), dtype=np.float32)
        X[1, 3] = np.nextafter(np.float32(0), np.float32(1))  # the smallest change of one value
        ids = input_ids(X)
        assert ids.dtype == np.uint64 and ids[0] != ids[1]
