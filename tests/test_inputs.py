"""Inputs read by chunks: memory-mapped arrays and Datasets certify and predict as the arrays they hold.

The host-memory probe of a large streamed Dataset is in ``test_inputs_memory.py``.
"""

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset

from smoothsk import _certification, _inputs
from smoothsk._inputs import dataset_labels, is_dataset, is_streamed, values_digest
from smoothsk.regions import MemoryAllocator, OnlineBallAllocator
from smoothsk.sigma import MultiStartFGSS

from conftest import forbid

#: Weight of the linear model the tests certify with, on inputs of shape (1, 2, 2).
WEIGHT = (1.0, -1.0, 0.5, 0.5)
#: Inputs per chunk the tests stream with, so that 40 inputs make 14 chunks.
CHUNK = 3
#: A sigma search that learns one sigma for all the inputs of a call.
SET_LEVEL = MultiStartFGSS(per_input=False, n=20)


class ItemList:
    """A map-style dataset that is no torch Dataset: ``__len__`` and ``__getitem__`` over a list, counting reads."""

    def __init__(self, items):
        self.items = items
        self.reads = 0

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        self.reads += 1
        return self.items[index]


class ArrayTable(ItemList):
    """A table with rows by index that also converts to an array (as a DataFrame does): an array-like."""

    def __init__(self):
        super().__init__([np.zeros(4)] * 2)

    def __array__(self, dtype=None, copy=None):
        return np.zeros((2, 4), dtype=dtype)


@pytest.fixture
def small_chunks(monkeypatch):
    """Stream :data:`CHUNK` inputs of shape (1, 2, 2) at a time."""
    monkeypatch.setattr(_inputs, "CHUNK_BYTES", CHUNK * 4 * 4)


@pytest.fixture
def data():
    """40 inputs of shape (1, 2, 2) around the linear model's boundary, and the model's labels (the sign of z)."""
    X = np.random.default_rng(0).normal(scale=0.5, size=(40, 1, 2, 2)).astype(np.float32)
    return X, (X.reshape(40, -1) @ np.asarray(WEIGHT) > 0).astype(np.int64)


@pytest.fixture
def clf(make_linear_classifier):
    """A fitted linear classifier on inputs (1, 2, 2), certifying with n = 200."""
    return make_linear_classifier(WEIGHT, sigma=0.5, n=200, n0=20, input_shape=(1, 2, 2))


def sources(X, y, folder):
    """The inputs ``X`` as every streamed source: Datasets of inputs and of pairs, and a memory-mapped .npy."""
    np.save(folder / "X.npy", X)
    return {"inputs": ItemList(list(X)),
            "pairs": ItemList([(torch.from_numpy(x), int(label)) for x, label in zip(X, y, strict=True)]),
            "tensor dataset": TensorDataset(torch.from_numpy(X), torch.from_numpy(y)),
            "float64 inputs": ItemList([x.astype(np.float64) for x in X]),
            "memmap": np.load(folder / "X.npy", mmap_mode="r")}


SOURCES = ["inputs", "pairs", "tensor dataset", "float64 inputs", "memmap"]


def assert_same_certificates(first, second):
    """Assert two ``certify(..., return_details=True)`` results are equal, every per-input field."""
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    for name, value in vars(first[2]).items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, getattr(second[2], name), err_msg=name)
        else:
            assert value == getattr(second[2], name), name


@pytest.mark.usefixtures("small_chunks")
class TestSameResultsAsArrays:
    @pytest.mark.parametrize("source", SOURCES)
    def test_certify_predict_and_predict_proba(self, clf, data, tmp_path, source):
        X, y = data
        streamed = sources(X, y, tmp_path)[source]
        assert is_streamed(streamed)
        assert_same_certificates(clf.certify(streamed, return_details=True), clf.certify(X, return_details=True))
        np.testing.assert_array_equal(clf.predict(streamed), clf.predict(X))
        np.testing.assert_array_equal(clf.predict_proba(streamed), clf.predict_proba(X))

    def test_every_chunk_is_read_in_order_once_to_check_and_once_to_certify(self, clf, data, monkeypatch):
        X, _ = data
        reads = []
        monkeypatch.setattr(_inputs.Inputs, "read", lambda self, start, stop, read=_inputs.Inputs.read: (
            reads.append((start, stop)), read(self, start, stop))[1])
        clf.certify(ItemList(list(X)))
        chunks = [(begin, min(begin + CHUNK, 40)) for begin in range(0, 40, CHUNK)]
        assert reads == chunks + chunks

    def test_n_jobs_gives_the_same_certificates(self, clf, data):
        X, _ = data
        assert_same_certificates(clf.set_params(n_jobs=2).certify(ItemList(list(X)), return_details=True),
                                 clf.set_params(n_jobs=None).certify(X, return_details=True))

    def test_a_checkpointed_stream_certifies_as_the_array(self, clf, data, tmp_path):
        X, _ = data
        streamed = clf.certify(ItemList(list(X)), return_details=True, checkpoint=tmp_path / "run.ckpt",
                               checkpoint_every=7)
        assert_same_certificates(streamed, clf.certify(X, return_details=True))

    def test_a_checkpoint_of_the_array_resumes_with_the_memmap(self, clf, data, tmp_path, monkeypatch):
        X, y = data
        expected = clf.certify(X, return_details=True, checkpoint=tmp_path / "run.ckpt", keep_checkpoint=True)
        forbid(monkeypatch, _certification, "certify_rows", "sampled instead of reading the array's checkpoint")
        memmap = sources(X, y, tmp_path)["memmap"]
        assert_same_certificates(clf.certify(memmap, return_details=True, checkpoint=tmp_path / "run.ckpt"),
                                 expected)

    @pytest.mark.parametrize("allocator", [OnlineBallAllocator(), MemoryAllocator()], ids=["online", "memory"])
    def test_a_stateful_allocator_streams_chunk_after_chunk_with_a_checkpoint(self, make_linear_classifier, data,
                                                                              tmp_path, allocator):
        X, _ = data
        array, stream = (make_linear_classifier(WEIGHT, sigma=0.5, n=200, n0=20, input_shape=(1, 2, 2),
                                                allocator=allocator) for _ in range(2))
        expected = array.certify(X, return_details=True, checkpoint=tmp_path / "array.ckpt", checkpoint_every=7)
        streamed = stream.certify(ItemList(list(X)), return_details=True, checkpoint=tmp_path / "stream.ckpt",
                                  checkpoint_every=7)
        assert_same_certificates(streamed, expected)
        assert stream.regions_.digest() == array.regions_.digest()
        np.testing.assert_array_equal(stream.predict(ItemList(list(X))), array.predict(X))


class TestOnePass:
    """A call whose certificates depend on all its inputs together reads them in one piece."""

    @pytest.mark.parametrize("params, method, message", [
        ({"allocator": OnlineBallAllocator()}, "certify", r"allocator=OnlineBallAllocator\(\) allocates regions"),
        ({"sigma_search": SET_LEVEL}, "certify", r"sigma_search=MultiStartFGSS\(.*\) learns one sigma for all"),
        ({"sigma_search": SET_LEVEL}, "predict", r"sigma_search=MultiStartFGSS\(.*\) learns one sigma for all"),
        ({"sigma_search": SET_LEVEL}, "predict_proba", r"sigma_search=MultiStartFGSS\(.*\) learns one sigma"),
    ], ids=["regions", "set-level certify", "set-level predict", "set-level predict_proba"])
    def test_a_dataset_is_refused_before_any_read(self, make_linear_classifier, data, params, method, message):
        X, _ = data
        clf = make_linear_classifier(WEIGHT, sigma=0.5, n=200, n0=20, input_shape=(1, 2, 2), **params)
        dataset = ItemList(list(X))
        with pytest.raises(ValueError, match=r"X is a Dataset, read by chunks, but " + message) as error:
            getattr(clf, method)(dataset)
        assert ("checkpoint=" in str(error.value)) == (method == "certify") and "\n" not in str(error.value)
        assert dataset.reads == 0

    @pytest.mark.usefixtures("small_chunks")
    @pytest.mark.parametrize("params", [{"allocator": OnlineBallAllocator()}, {"sigma_search": SET_LEVEL}],
                             ids=["regions", "set-level"])
    def test_a_memmap_is_read_whole_as_the_array_it_is(self, make_linear_classifier, data, tmp_path, params):
        # As joblib hands a large array to the workers of GridSearchCV(n_jobs=...): a scorer certifies it.
        X, y = data
        array, mapped = (make_linear_classifier(WEIGHT, sigma=0.5, n=200, n0=20, input_shape=(1, 2, 2), **params)
                         for _ in range(2))
        memmap = sources(X, y, tmp_path)["memmap"]
        assert_same_certificates(mapped.certify(memmap, return_details=True), array.certify(X, return_details=True))
        np.testing.assert_array_equal(mapped.predict(memmap), array.predict(X))


def shifted(items, index, item):
    """``items`` with item ``index`` replaced by ``item``, as an :class:`ItemList`."""
    items = list(items)
    items[index] = item
    return ItemList(items)


@pytest.mark.usefixtures("small_chunks")
class TestBadSources:
    @pytest.mark.parametrize("make, message", [
        (lambda X: shifted(X, 31, np.zeros((1, 2, 3), np.float32)),
         r"X\[31\] \(item 31 of the Dataset X\) is an input of shape \(1, 2, 3\), but item 0 is an input of shape "
         r"\(1, 2, 2\): every item of X must be alike"),
        (lambda X: ItemList([torch.from_numpy(x).to(torch.int64) for x in X]),
         r"X\[0\] \(item 0 of the Dataset X\) holds int64 values, not floats"),
        (lambda X: shifted(X, 5, (X[5], 1)), r"X\[5\] .* is an input of shape \(1, 2, 2\) with a label, but item 0 "
                                            r"is an input of shape \(1, 2, 2\):"),
        (lambda X: shifted(X, 2, (X[2], 1, 2)), r"X\[2\] .* is a tuple of 3; each item must be an input or a pair"),
        (lambda X: shifted(X, 2, {"x": X[2]}), r"X\[2\] .* is a dict of 1"),
        (lambda X: ItemList([(x, np.ones(2)) for x in X]), r"X\[0\] .* has the label array\(\[1., 1.\]\); a label "
                                                            r"must be an int, a bool or a string"),
        (lambda X: shifted(X, 3, "an image.png"), r"X\[3\] .* holds a str, not an input"),
        (lambda X: shifted(X, 38, np.full((1, 2, 2), np.nan, np.float32)),
         r"X\[38\] \(item 38 of the Dataset X\) holds NaN or infinite values as float32"),
        (lambda X: shifted(X, 7, np.full((1, 2, 2), 1e39)), r"X\[7\] .* holds NaN or infinite values as float32"),
        (lambda X: ItemList([np.zeros(5, np.float32)] * 4), r"X has 5 features, but SampleWiseSmoothedClassifier is "
                                                            r"expecting 4 features"),
        (lambda X: ItemList([np.zeros((4, 1), np.float32)] * 4), r"X has inputs of shape \(4, 1\), but "
                                                                 r"SampleWiseSmoothedClassifier was fitted on inputs "
                                                                 r"of shape \(1, 2, 2\)"),
        (lambda X: ItemList([]), r"X is an empty Dataset"),
    ], ids=["shape", "integers", "label", "triple", "dict", "vector label", "not an array", "nan", "overflow",
            "features",
            "input shape", "empty"])
    def test_refused_in_one_line_before_any_sampling(self, clf, data, monkeypatch, make, message):
        forbid(monkeypatch, _certification, "certify_rows", "sampled a bad source")
        forbid(monkeypatch, _certification, "prediction_counts", "sampled a bad source")
        for method in ("certify", "predict", "predict_proba"):
            with pytest.raises(ValueError, match=message) as error:
                getattr(clf, method)(make(data[0]))
            assert "\n" not in str(error.value)

    def test_an_iterable_dataset_is_refused(self, clf):
        class Stream(IterableDataset):
            def __iter__(self):
                yield np.zeros((1, 2, 2), np.float32)

        with pytest.raises(ValueError, match="X is an IterableDataset; certify and predict read map-style Datasets"):
            clf.certify(Stream())

    def test_a_memmap_row_that_is_not_finite_is_named(self, clf, data, tmp_path):
        X = data[0].copy()
        X[33, 0, 1, 1] = np.inf
        np.save(tmp_path / "x.npy", X)
        with pytest.raises(ValueError, match=r"X\[33\] \(row 33 of the memory-mapped array X, file .*x.npy\) holds "
                                             r"NaN or infinite"):
            clf.predict(np.load(tmp_path / "x.npy", mmap_mode="r"))

    def test_a_memmap_of_one_input_is_refused(self, clf, tmp_path):
        np.save(tmp_path / "x.npy", np.zeros((1, 2, 2), np.float32))
        with pytest.raises(ValueError, match=r"X has shape \(1, 2, 2\), the shape of one input"):
            clf.certify(np.load(tmp_path / "x.npy", mmap_mode="r"))


class TestLabels:
    def test_score_takes_the_labels_of_a_dataset_of_pairs(self, clf, data, tmp_path):
        X, y = data
        y = 1 - y  # wrong labels: a score of the pairs' labels, not of the model's
        pairs = sources(X, y, tmp_path)["pairs"]
        assert clf.score(pairs) == clf.score(X, y)

    def test_score_needs_labels(self, clf, data):
        with pytest.raises(ValueError, match="score needs the true labels y"):
            clf.score(ItemList(list(data[0])))

    def test_dataset_labels_are_the_pairs_labels(self, data, tmp_path):
        X, y = data
        for source in ("pairs", "tensor dataset"):
            labels = dataset_labels(sources(X, y, tmp_path)[source])
            np.testing.assert_array_equal(labels, y)
            assert labels.dtype.kind == "i"
        strings = dataset_labels(ItemList([(x, str(label)) for x, label in zip(X, y, strict=True)]))
        assert strings.tolist() == [str(label) for label in y]

    def test_a_dataset_without_labels_has_none(self, data):
        assert dataset_labels(ItemList(list(data[0]))) is None
        assert dataset_labels(data[0]) is None


class TestWhatIsStreamed:
    @pytest.mark.parametrize("X", [np.zeros((2, 4)), [[0.0] * 4] * 2, torch.zeros(2, 4), ArrayTable(), {"a": 1}],
                             ids=["array", "list", "tensor", "array interface", "dict"])
    def test_array_likes_are_not(self, X):
        assert not is_streamed(X) and not is_dataset(X)

    def test_datasets_and_memmaps_are(self, tmp_path):
        np.save(tmp_path / "x.npy", np.zeros((2, 4)))
        assert is_dataset(TensorDataset(torch.zeros(2, 4))) and is_dataset(ItemList([]))
        assert is_streamed(np.load(tmp_path / "x.npy", mmap_mode="r"))
        assert not is_dataset(np.load(tmp_path / "x.npy", mmap_mode="r"))

    def test_values_digest_follows_the_values(self, data, tmp_path):
        X, y = data
        digest = values_digest(ItemList(list(X)))
        assert values_digest(ItemList(list(X))) == digest
        assert values_digest(ItemList(list(X[::-1]))) != digest
        assert values_digest(ItemList([(x, 0) for x in X])) != digest
        assert values_digest(sources(X, y, tmp_path)["memmap"]) != values_digest(ItemList(list(X[:-1])))
