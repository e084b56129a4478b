"""Data sets: the bundled digits, local MNIST / CIFAR-10 files and the synthetic heterogeneous-margin task."""

import codecs
import gzip
import os
import pickle

import numpy as np
import pytest

from smoothsk.datasets import load_cifar10, load_digits_images, load_mnist, make_heterogeneous_margins


def write_idx(path, array, compress=False):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


class TestDigits:
    def test_shape_dtype_range_labels(self):
        X, y = load_digits_images()
        assert X.shape == (1797, 1, 8, 8) and X.dtype == np.float32
        assert X.min() == 0.0 and X.max() == 1.0
        assert y.dtype == np.int64 and sorted(set(y.tolist())) == list(range(10))

    def test_same_pixels_as_scikit_learn(self):
        from sklearn.datasets import load_digits
        np.testing.assert_allclose(load_digits_images()[0].reshape(1797, 64) * 16, load_digits().data)


class TestMnist:
    @pytest.mark.parametrize("compress, names", [
        (False, ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")),
        (True, ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")),
        (False, ("train-images.idx3-ubyte", "train-labels.idx1-ubyte")),
    ])
    def test_reads_idx_files(self, tmp_path, compress, names):
        images = np.arange(3 * 28 * 28).reshape(3, 28, 28) % 256
        write_idx(tmp_path / names[0], images, compress)
        write_idx(tmp_path / names[1], np.array([7, 0, 3]), compress)
        X, y = load_mnist(tmp_path)
        assert X.shape == (3, 1, 28, 28) and X.dtype == np.float32
        np.testing.assert_allclose(X[:, 0] * 255, images, atol=1e-4)
        assert y.tolist() == [7, 0, 3] and y.dtype == np.int64

    def test_test_split(self, tmp_path):
        write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((2, 28, 28)))
        write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([1, 2]))
        assert load_mnist(tmp_path, train=False)[1].tolist() == [1, 2]

    def test_missing_files(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
            load_mnist(tmp_path)

    @pytest.mark.parametrize("header", [b"\x01\x02\x03\x04", b"\x00\x00\x08", b""])
    def test_bad_magic_number(self, tmp_path, header):
        (tmp_path / "train-images-idx3-ubyte").write_bytes(header)
        write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([1]))
        with pytest.raises(ValueError, match="train-images-idx3-ubyte is not an unsigned-byte IDX file"):
            load_mnist(tmp_path)

    @pytest.mark.parametrize("change, match", [
        (lambda data: data[:-1], r"declares 3x28x28 \(2352 bytes\) but 2351 follow"),
        (lambda data: data + b"\x00", r"declares 3x28x28 \(2352 bytes\) but 2353 follow"),
        (lambda data: data[:4] + (2**32 - 1).to_bytes(4, "big") * 3 + data[16:],
         r"declares 4294967295x4294967295x4294967295 \(\d+ bytes\) but 2352 follow"),
        (lambda data: data[:10], r"ends inside its header \(10 bytes; 3 dimensions need 16\)"),
    ], ids=["short", "long", "huge", "truncated-header"])
    def test_size_declared_in_header_must_match_the_data(self, tmp_path, change, match):
        write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((3, 28, 28)))
        write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([1, 2, 3]))
        path = tmp_path / "train-images-idx3-ubyte"
        path.write_bytes(change(path.read_bytes()))
        with pytest.raises(ValueError, match="train-images-idx3-ubyte " + match):
            load_mnist(tmp_path)

    @pytest.mark.parametrize("images_shape, labels_shape, match", [
        ((3, 1, 28, 28), (3,), "train-images-idx3-ubyte has 4 dimensions; expected 3"),
        ((3, 784), (3,), "train-images-idx3-ubyte has 2 dimensions; expected 3"),
        ((3, 28, 28), (3, 1), "train-labels-idx1-ubyte has 2 dimensions; expected 1"),
    ])
    def test_dimension_count_is_checked(self, tmp_path, images_shape, labels_shape, match):
        write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros(images_shape))
        write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(labels_shape))
        with pytest.raises(ValueError, match=match):
            load_mnist(tmp_path)


class TestCifar10:
    def write_batch(self, path, n, label):
        data = np.arange(n * 3072).reshape(n, 3072) % 256
        with open(path, "wb") as f:
            pickle.dump({b"data": data.astype(np.uint8), b"labels": [label] * n}, f)
        return data

    def test_reads_python_batches(self, tmp_path):
        for i in range(1, 6):
            self.write_batch(tmp_path / f"data_batch_{i}", 2, i)
        data = self.write_batch(tmp_path / "test_batch", 3, 9)
        X, y = load_cifar10(tmp_path)
        assert X.shape == (10, 3, 32, 32) and X.dtype == np.float32 and y.tolist() == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
        X_test, y_test = load_cifar10(tmp_path, train=False)
        np.testing.assert_allclose(X_test.reshape(3, 3072) * 255, data, atol=1e-3)
        assert y_test.tolist() == [9, 9, 9]

    def test_missing_batch(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
            load_cifar10(tmp_path)

    def test_reads_batch_in_cifar_format(self, tmp_path):
        # As the published batches: a dict with bytes keys of a uint8 array, lists of labels and of
        # file names, and a label, pickled with protocol 2 (bytes then go through _codecs.encode).
        data = (np.arange(2 * 3072) % 256).astype(np.uint8).reshape(2, 3072)
        batch = {b"batch_label": b"testing batch 1 of 1", b"labels": [3, 8], b"data": data,
                 b"filenames": [b"cat_1.png", b"ship_2.png"]}
        with open(tmp_path / "test_batch", "wb") as f:
            pickle.dump(batch, f, protocol=2)
        X, y = load_cifar10(tmp_path, train=False)
        np.testing.assert_allclose(X.reshape(2, 3072) * 255, data, atol=1e-3)
        assert y.tolist() == [3, 8]

    def test_refuses_batch_that_would_run_code(self, tmp_path):
        marker = tmp_path / "code_ran"

        class Payload:
            def __reduce__(self):
                return os.mkdir, (str(marker),)

        with open(tmp_path / "test_batch", "wb") as f:
            pickle.dump({b"data": Payload(), b"labels": [0]}, f, protocol=2)
        with pytest.raises(pickle.UnpicklingError, match=r"test_batch.*\.mkdir.*refused"):
            load_cifar10(tmp_path, train=False)
        assert not marker.exists()

    def test_refuses_other_codecs(self, tmp_path):
        # _codecs.encode is allowed for the latin-1 bytes of protocol 2, not as a gateway to other codecs.
        class Payload:
            def __reduce__(self):
                return codecs.encode, ("x", "rot_13")

        with open(tmp_path / "test_batch", "wb") as f:
            pickle.dump({b"data": Payload(), b"labels": [0]}, f, protocol=2)
        with pytest.raises(pickle.UnpicklingError, match="test_batch.*latin1.*rot_13"):
            load_cifar10(tmp_path, train=False)


class TestMakeHeterogeneousMargins:
    def test_shapes_balance_and_determinism(self):
        X, y = make_heterogeneous_margins(n_samples=250, n_features=64, random_state=3)
        assert X.shape == (250, 64) and X.dtype == np.float32 and y.dtype == np.int64
        assert np.bincount(y).min() >= 250 // 12 and np.bincount(y).max() <= 250 // 12 + 1
        X2, y2 = make_heterogeneous_margins(n_samples=250, n_features=64, random_state=3)
        np.testing.assert_array_equal(X, X2)
        np.testing.assert_array_equal(y, y2)
        assert not np.array_equal(X, make_heterogeneous_margins(n_samples=250, n_features=64, random_state=4)[0])

    def test_group_geometry(self):
        spacings, counts, distance, spread = (0.5, 3.0), (3, 2), 5.0, 0.1
        X, y = make_heterogeneous_margins(n_samples=5000, n_features=32, spacings=spacings,
                                          classes_per_group=counts, group_distance=distance, spread=spread)
        means = np.stack([X[y == k].mean(axis=0) for k in range(5)]).astype(np.float64)
        gaps = np.linalg.norm(means[:, None] - means[None], axis=2)
        # Sample means are off by about spread * sqrt(n_features / 1000) = 0.018 per class.
        np.testing.assert_allclose(gaps[[0, 0, 1], [1, 2, 2]], 0.5, atol=0.06)
        np.testing.assert_allclose(gaps[3, 4], 3.0, atol=0.06)
        between = np.sqrt(2 * distance**2 + (spacings[0] ** 2 + spacings[1] ** 2) / 2)
        np.testing.assert_allclose(gaps[:3, 3:], between, atol=0.06)
        within = X[y == 0] - means[0]
        assert abs(within.std() - spread) < 0.01

    @pytest.mark.parametrize("kwargs, match", [
        ({"spacings": (1.0, 2.0), "classes_per_group": (3,)}, "sequences of the same length"),
        ({"classes_per_group": (6, 0, 2)}, "at least one class per group"),
        ({"n_features": 10}, "n_features must be at least 15 .*got 10"),
    ])
    def test_invalid_arguments(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            make_heterogeneous_margins(**kwargs)
