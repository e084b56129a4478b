"""Data sets: the bundled digits, local MNIST / CIFAR-10 files and the synthetic heterogeneous-margin task."""

import gzip
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from smoothsk.datasets import (
    load_cifar10,
    load_digits_images,
    load_mnist,
    load_mnist_protocol,
    make_heterogeneous_margins,
)


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

    @pytest.mark.parametrize("header, words", [(b"\x01\x02\x03\x04", " is not an unsigned-byte IDX file"),
                                               (b"\x00\x00\x08", " is not an unsigned-byte IDX file"),
                                               (b"", ": cannot be read \\(an empty file\\)")])
    def test_bad_magic_number(self, tmp_path, header, words):
        (tmp_path / "train-images-idx3-ubyte").write_bytes(header)
        write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([1]))
        with pytest.raises(ValueError, match="train-images-idx3-ubyte" + words):
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

    def test_a_gzip_bomb_is_refused_before_it_is_inflated(self, tmp_path):
        """A 60 KB gzipped file declaring 60 MB of pixels (1000x its size) is refused from its header alone."""
        header = b"\x00\x00\x08\x03" + b"".join(size.to_bytes(4, "big") for size in (76_531, 28, 28))
        with gzip.open(tmp_path / "train-images-idx3-ubyte.gz", "wb") as f:
            f.write(header + bytes(76_531 * 28 * 28))
        write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([1]))
        with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz declares 76531x28x28 .*over 256 times"):
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


    @pytest.mark.parametrize("images, labels, match", [
        (np.zeros((3, 28, 28)), np.array([1, 2]), r"3 images in .*train-images-idx3-ubyte but 2 labels in"),
        (np.zeros((3, 1, 784)), np.array([1, 2, 3]), r"images-idx3-ubyte holds images of 1x784 pixels"),
        (np.zeros((0, 28, 28)), np.zeros(0), r"train-images-idx3-ubyte holds no image"),
        (np.zeros((2, 28, 28)), np.array([1, 10]), r"train-labels-idx1-ubyte holds labels outside 0-9"),
    ], ids=["counts", "image-size", "empty", "label"])
    def test_images_and_labels_must_make_mnist(self, tmp_path, images, labels, match):
        write_idx(tmp_path / "train-images-idx3-ubyte", images)
        write_idx(tmp_path / "train-labels-idx1-ubyte", labels)
        with pytest.raises(ValueError, match=match):
            load_mnist(tmp_path)

    @pytest.mark.parametrize("damage", [lambda data: data[:len(data) // 2], lambda data: data[:-4] + b"\0\0\0\0",
                                        lambda data: b"not gzip" + data[8:]],
                             ids=["truncated", "bad-length", "not-gzip"])
    def test_a_damaged_gzip_file_is_refused_naming_it(self, tmp_path, damage):
        write_idx(tmp_path / "train-images-idx3-ubyte", np.arange(3 * 28 * 28).reshape(3, 28, 28) % 7, compress=True)
        write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([1, 2, 3]))
        path = tmp_path / "train-images-idx3-ubyte.gz"
        path.write_bytes(damage(path.read_bytes()))
        with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz: ") as error:
            load_mnist(tmp_path)
        assert "\n" not in str(error.value)


SHARED_MNIST = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"


def write_mnist_csv(path, images, labels):
    """The 5,000-image CSV's format: one gzipped row per image, 784 pixels then the label."""
    rows = np.column_stack([images.reshape(len(images), -1), labels])
    with gzip.open(path, "wt") as f:
        np.savetxt(f, rows, fmt="%d", delimiter=",")


class TestMnistProtocol:
    @pytest.mark.skipif(not SHARED_MNIST.exists(), reason="the shared real MNIST (../shared/data/mnist) is absent")
    def test_the_shared_files_give_the_published_split_sizes(self):
        splits = load_mnist_protocol(SHARED_MNIST)
        assert splits.protocol == "5k"
        assert [len(splits[f"X_{name}"]) for name in ("train", "validation", "certify")] == [10_000, 4_500, 500]
        np.testing.assert_array_equal(splits.certify_index, np.arange(0, 10_000, 20))
        assert splits.X_certify.shape[1:] == (1, 28, 28) and splits.X_certify.dtype == np.float32
        X_test, y_test = load_mnist(SHARED_MNIST, train=False)
        np.testing.assert_array_equal(splits.X_certify, X_test[::20])
        np.testing.assert_array_equal(splits.y_certify, y_test[::20])
        np.testing.assert_array_equal(splits.X_train[5_000:], X_test[1::2])
        assert np.bincount(splits.y_train[:5_000]).tolist() == [500] * 10

    def test_the_5k_protocol_on_small_files(self, tmp_path):
        rng = np.random.default_rng(0)
        test_images, test_labels = rng.integers(0, 256, (60, 28, 28)), np.arange(60) % 10
        write_idx(tmp_path / "t10k-images-idx3-ubyte", test_images, compress=True)
        write_idx(tmp_path / "t10k-labels-idx1-ubyte", test_labels, compress=True)
        write_mnist_csv(tmp_path / "mnist_5k.csv.gz", rng.integers(0, 256, (4, 28, 28)), np.array([3, 1, 4, 1]))
        splits = load_mnist_protocol(tmp_path)
        assert splits.certify_index.tolist() == [0, 20, 40]
        assert splits.y_train.tolist() == [3, 1, 4, 1] + (np.arange(1, 60, 2) % 10).tolist()
        validation = [i for i in range(60) if i % 2 == 0 and i % 20 != 0]
        assert splits.y_validation.tolist() == (np.array(validation) % 10).tolist()
        np.testing.assert_array_equal(splits.X_validation[0, 0], test_images[2].astype(np.float32) / 255.0)

    def test_the_official_training_files_replace_the_5k_set(self, tmp_path):
        write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((40, 28, 28)))
        write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.arange(40) % 10)
        write_idx(tmp_path / "train-images-idx3-ubyte", np.ones((7, 28, 28)))
        write_idx(tmp_path / "train-labels-idx1-ubyte", np.arange(7))
        splits = load_mnist_protocol(tmp_path)
        assert splits.protocol == "official"
        assert (len(splits.X_train), len(splits.X_validation), len(splits.X_certify)) == (7, 38, 2)

    @pytest.mark.parametrize(("rows", "match"), [
        ("1,2,3\n", "rows of 3 columns; expected 785"),
        (",".join(["300"] * 784) + ",1\n", "is not a CSV of integers in 0-255"),
        (",".join(["0"] * 784) + ",10\n", "labels outside 0-9"),
        (",".join(["a"] * 785) + "\n", "is not a CSV of integers in 0-255"),
    ], ids=["columns", "pixel", "label", "text"])
    def test_a_malformed_csv_is_refused_naming_it(self, rows, match, tmp_path):
        write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((20, 28, 28)))
        write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(20))
        with gzip.open(tmp_path / "mnist_5k.csv.gz", "wt") as f:
            f.write(rows)
        with pytest.raises(ValueError, match=rf"mnist_5k\.csv\.gz .*{match}"):
            load_mnist_protocol(tmp_path)

    def test_a_damaged_gzipped_csv_is_refused_naming_it(self, tmp_path):
        write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((20, 28, 28)))
        write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(20))
        write_mnist_csv(tmp_path / "mnist_5k.csv.gz", np.zeros((3, 28, 28)), np.array([1, 2, 3]))
        path = tmp_path / "mnist_5k.csv.gz"
        path.write_bytes(path.read_bytes()[:-6])
        with pytest.raises(ValueError, match=r"mnist_5k\.csv\.gz: "):
            load_mnist_protocol(tmp_path)

    def test_a_folder_without_training_images_is_named(self, tmp_path):
        write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((20, 28, 28)))
        write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(20))
        with pytest.raises(FileNotFoundError, match="neither MNIST's training files .* nor mnist_5k.csv.gz"):
            load_mnist_protocol(tmp_path)


class ForgedDtype:
    """Pickles as a ``numpy.dtype`` whose one field holds objects, its flags forged to say the dtype pickles as bytes.

    With ``NPY_LIST_PICKLE`` cleared, ``ndarray.__setstate__`` copies the
    state's bytes into the array, where they are then taken as object pointers.
    """

    def __reduce__(self):
        object_flags = np.dtype([("a", "O")]).__reduce__()[2][-1]
        state = (3, "|", None, ("a",), {"a": (np.dtype("O"), 0)}, 8, 1, object_flags & ~2)  # NPY_LIST_PICKLE
        return np.dtype, ("V8", False, True), state


class ForgedArray:
    """Pickles as numpy's ``_reconstruct`` of an array of ForgedDtype whose raw bytes become object pointers."""

    def __reduce__(self):
        reconstruct = np.zeros(1).__reduce_ex__(2)[0]
        pointers = (0x4141414141414141).to_bytes(8, "little") * 4
        return reconstruct, (np.ndarray, (0,), b"b"), (1, (4,), ForgedDtype(), False, pointers)


# The attack on a loader that unpickles CIFAR-10's python batches while allowing numpy's reconstruct:
# only numpy.dtype, numpy.ndarray and _reconstruct are named, yet the array's state is read as pointers.
FORGED_BATCH = pickle.dumps({b"data": ForgedArray(), b"labels": [0] * 4}, protocol=2)

LOAD_IN_A_CHILD = """
import sys
from pathlib import Path
from smoothsk.datasets import load_cifar10
for folder in sys.argv[1:]:
    print(Path(folder).name, end=": ", flush=True)
    try:
        X, y = load_cifar10(folder, train=Path(folder).name.startswith("train"))
    except (OSError, ValueError) as error:
        print("refused:", error, flush=True)
    else:
        print("loaded", X.shape, flush=True)
"""


def write_cifar_binary(folder, name, labels, pixels=None):
    """One batch file of CIFAR-10's binary version: per record a label byte, then 3,072 pixel bytes."""
    labels = np.asarray(labels, dtype=np.uint8)
    if pixels is None:
        pixels = (np.arange(len(labels) * 3072) % 251).reshape(len(labels), 3072)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(np.column_stack([labels, pixels]).astype(np.uint8).tobytes())
    return pixels


class TestCifar10:
    def test_reads_binary_batches(self, tmp_path):
        for i in range(1, 6):
            write_cifar_binary(tmp_path, f"data_batch_{i}.bin", [i, i + 4])
        pixels = write_cifar_binary(tmp_path, "test_batch.bin", [9, 0, 3])
        X, y = load_cifar10(tmp_path)
        assert X.shape == (10, 3, 32, 32) and X.dtype == np.float32 and y.dtype == np.int64
        assert y.tolist() == [1, 5, 2, 6, 3, 7, 4, 8, 5, 9]
        X_test, y_test = load_cifar10(tmp_path, train=False)
        assert y_test.tolist() == [9, 0, 3] and X_test.min() >= 0.0 and X_test.max() <= 1.0
        np.testing.assert_allclose(X_test.reshape(3, 3072) * 255, pixels, atol=1e-4)

    def test_pixel_layout_is_red_green_blue_planes_row_major(self, tmp_path):
        pixels = np.concatenate([np.full(1024, 10), np.full(1024, 20), np.full(1024, 30)])
        pixels[5 * 32 + 7] = 200  # red, row 5, column 7
        write_cifar_binary(tmp_path, "test_batch.bin", [4], pixels[None])
        X, _ = load_cifar10(tmp_path, train=False)
        np.testing.assert_allclose(X[0, :, 0, 0] * 255, [10, 20, 30], atol=1e-4)
        assert X[0, 0, 5, 7] * 255 == pytest.approx(200) and X[0, 0, 7, 5] * 255 == pytest.approx(10)

    def test_accepts_the_folder_holding_cifar_10_batches_bin(self, tmp_path):
        write_cifar_binary(tmp_path / "cifar-10-batches-bin", "test_batch.bin", [2, 7])
        assert load_cifar10(tmp_path, train=False)[1].tolist() == [2, 7]

    def test_missing_batch(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="data_batch_1.bin not found.*cifar-10-batches-bin"):
            load_cifar10(tmp_path)

    @pytest.mark.parametrize("size", [0, 3072, 3074, 2 * 3073 + 1])
    def test_refuses_a_size_that_is_not_whole_records(self, tmp_path, size):
        (tmp_path / "test_batch.bin").write_bytes(bytes(size))
        words = (r"cannot be read \(an empty file\)" if size == 0
                 else f"holds {size} bytes; expected 1 to 10,000 records")
        with pytest.raises(ValueError, match="test_batch.bin:? " + words):
            load_cifar10(tmp_path, train=False)

    def test_accepts_the_official_10000_records(self, tmp_path):
        with open(tmp_path / "test_batch.bin", "wb") as f:
            f.truncate(10_000 * 3073)
        X, y = load_cifar10(tmp_path, train=False)
        assert X.shape == (10_000, 3, 32, 32) and not y.any()

    def test_refuses_more_records_than_a_batch_before_reading_them(self, tmp_path):
        # A sparse file of 10^6 records (3 GB): refused from its size, before anything is read or allocated.
        with open(tmp_path / "test_batch.bin", "wb") as f:
            f.truncate(10**6 * 3073)
        with pytest.raises(ValueError, match="test_batch.bin holds 3073000000 bytes; expected 1 to 10,000 records"):
            load_cifar10(tmp_path, train=False)

    def test_refuses_a_label_above_9(self, tmp_path):
        write_cifar_binary(tmp_path, "test_batch.bin", [3, 9, 10, 200])
        with pytest.raises(ValueError, match=r"test_batch.bin: label 10 at index 2; CIFAR-10's labels are 0 to 9"):
            load_cifar10(tmp_path, train=False)

    @pytest.mark.parametrize("inside", ["", "cifar-10-batches-py"])
    def test_refuses_the_python_version(self, tmp_path, inside):
        folder = tmp_path / inside
        folder.mkdir(exist_ok=True)
        for name in ["batches.meta", "test_batch", *(f"data_batch_{i}" for i in range(1, 6))]:
            (folder / name).write_bytes(pickle.dumps({b"labels": [0]}, protocol=2))
        with pytest.raises(FileNotFoundError, match=r"data_batch_1.bin not found: .* CIFAR-10's python version, "
                                                    r".*pickles.*binary version.*cifar-10-binary.tar.gz"):
            load_cifar10(tmp_path)

    def test_forged_dtype_pickle_is_refused_without_crashing(self, tmp_path):
        # An allowed numpy.dtype state with an object field and forged flags made the restricted unpickler
        # of the python batches read the file's bytes as object pointers: the process died of SIGSEGV. The
        # files are loaded in a child process, so that a crash fails this test instead of the test run.
        cases = {  # folder: file name, padded to a whole record, expected refusal
            "train-py": ("data_batch_1", False, r"data_batch_1.bin not found: .*python version"),
            "test-py": ("test_batch", False, r"test_batch.bin not found: .*python version"),
            "test-bin": ("test_batch.bin", False, r"test_batch.bin holds \d+ bytes; expected 1 to 10,000 records"),
            "test-bin-padded": ("test_batch.bin", True, r"test_batch.bin: label 128 at index 0"),  # 0x80: PROTO
        }
        for folder, (name, padded, _) in cases.items():
            (tmp_path / folder).mkdir()
            (tmp_path / folder / name).write_bytes(FORGED_BATCH + bytes(-len(FORGED_BATCH) % 3073 if padded else 0))
        root = Path(__file__).resolve().parents[1]
        result = subprocess.run([sys.executable, "-c", LOAD_IN_A_CHILD, *(str(tmp_path / f) for f in cases)],
                                cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"the loader died (return code {result.returncode}): {result.stdout}"
        lines = result.stdout.splitlines()
        assert len(lines) == len(cases), result.stdout
        for line, (folder, (_, _, match)) in zip(lines, cases.items(), strict=True):
            assert re.match(f"{folder}: refused: .*{match}", line), line


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
