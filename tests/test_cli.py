"""The smoothsk command line."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from smoothsk import ABSTAIN, SampleWiseSmoothedClassifier, _certification, cli
from smoothsk._npz import NpyFile
from smoothsk.cli import SUMMARY_RADII, build_parser, main
from smoothsk.models import FlatMLP, Normalized
from smoothsk.regions import OnlineBallAllocator
from smoothsk.sampling import InputSpecificSampler, SequentialSampler
from smoothsk.sigma import FixedSigma
from smoothsk.training import FixedSigmaTraining

from conftest import forbid
from npz_support import npy_bytes, write_npz


def test_unknown_command_is_refused():
    with pytest.raises(SystemExit, match="2"):
        build_parser().parse_args(["train"])


# smoothsk fit / smoothsk certify


@pytest.fixture(scope="module")
def npz_data(tmp_path_factory):
    """A small two-class .npz (X float32 (120, 16), y int) and the path of a model fitted on it by the CLI."""
    from smoothsk.datasets import make_heterogeneous_margins
    folder = tmp_path_factory.mktemp("cli")
    X, y = make_heterogeneous_margins(n_samples=120, n_features=16, random_state=0)
    data = folder / "data.npz"
    np.savez(data, X=X, y=y)
    model = folder / "model.safetensors"
    assert main(["fit", str(data), "--out", str(model), "--epochs", "2", "--n", "60", "--n0", "10",
                 "--random-state", "3"]) == 0
    return X, y, data, model


def read_csv(path):
    import csv
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


class TestFitCertify:
    def test_round_trip_writes_one_row_per_input_equal_to_the_saved_model(self, npz_data, tmp_path):
        X, y, data, model = npz_data
        out = tmp_path / "certificates.csv"
        assert main(["certify", str(model), str(data), "--out", str(out), "--n", "50", "--n0", "10"]) == 0
        rows = read_csv(out)
        assert list(rows[0]) == ["index", "prediction", "radius", "sigma", "n_samples", "guarantee", "y", "correct"]
        assert len(rows) == len(X)
        clf = SampleWiseSmoothedClassifier.load(model).set_params(sampler__n=50, sampler__n0=10)
        prediction, radius, details = clf.certify(X, return_details=True)
        assert [int(row["index"]) for row in rows] == list(range(len(X)))
        assert [int(row["prediction"]) for row in rows] == prediction.tolist()
        assert [float(row["radius"]) for row in rows] == radius.tolist()
        assert [float(row["sigma"]) for row in rows] == details.sigma.tolist()
        assert {int(row["n_samples"]) for row in rows} == {60}
        assert [int(row["y"]) for row in rows] == y.tolist()
        # The statement of the certificates' classifier (TestCertificateGuarantee checks its wording).
        assert {row["guarantee"] for row in rows} == {details.guarantee}

    def test_certify_a_saved_set_of_experts_with_its_selector(self, fitted_experts, tmp_path):
        """The model file alone rebuilds the experts: no module to pass, as the command line has none."""
        clf, X, y = fitted_experts
        clf.save(tmp_path / "experts.safetensors")
        np.savez(tmp_path / "data.npz", X=X[:20], y=y[:20])
        out = tmp_path / "certificates.csv"
        assert main(["certify", str(tmp_path / "experts.safetensors"), str(tmp_path / "data.npz"), "--out", str(out),
                     "--n", "100", "--n0", "10"]) == 0
        rows = read_csv(out)
        loaded = SampleWiseSmoothedClassifier.load(tmp_path / "experts.safetensors")
        prediction, radius, details = loaded.set_params(sampler__n=100, sampler__n0=10).certify(
            X[:20], return_details=True)
        assert [int(row["prediction"]) for row in rows] == prediction.tolist()
        assert [float(row["radius"]) for row in rows] == radius.tolist()
        assert [float(row["sigma"]) for row in rows] == details.sigma.tolist()
        assert len({row["sigma"] for row in rows}) > 1  # the selector routes inputs to several experts

    def test_fit_saves_the_preset_module_and_seed(self, npz_data, tmp_path):
        clf = SampleWiseSmoothedClassifier.load(npz_data[3])
        assert clf.module is FlatMLP and clf.random_state == 3 and clf.max_epochs == 2
        assert isinstance(clf.training, FixedSigmaTraining) and clf.training.sigma == 0.25
        assert len(clf.history) == 2

    def test_sample_wise_preset_states_the_own_sigma_guarantee(self, npz_data, tmp_path):
        X, _, data, _ = npz_data
        model, out = tmp_path / "m.safetensors", tmp_path / "c.csv"
        assert main(["fit", str(data), "--out", str(model), "--epochs", "1", "--preset", "ddrs"]) == 0
        test = tmp_path / "test.npz"
        np.savez(test, X=X[:5])
        assert main(["certify", str(model), str(test), "--out", str(out), "--n", "30", "--n0", "10"]) == 0
        rows = read_csv(out)
        assert len(rows) == 5 and "y" not in rows[0]
        clf = SampleWiseSmoothedClassifier.load(model).set_params(sampler__n=30, sampler__n0=10)
        _, _, details = clf.certify(X[:5], return_details=True)
        assert not isinstance(clf.sigma_search, FixedSigma)  # DDRS's gradient search: a per-input sigma
        assert {row["guarantee"] for row in rows} == {details.guarantee}
        assert [float(row["sigma"]) for row in rows] == details.sigma.tolist()

    def test_checkpoint_gives_the_same_csv(self, npz_data, tmp_path):
        _, _, data, model = npz_data
        plain, resumed = tmp_path / "plain.csv", tmp_path / "resumed.csv"
        common = ["--n", "40", "--n0", "10", "--n-jobs", "1"]
        assert main(["certify", str(model), str(data), "--out", str(plain), *common]) == 0
        assert main(["certify", str(model), str(data), "--out", str(resumed), "--checkpoint",
                     str(tmp_path / "run.ckpt"), *common]) == 0
        assert plain.read_text() == resumed.read_text()
        assert not (tmp_path / "run.ckpt").exists()  # removed once the CSV is written

    def test_a_checkpoint_link_leaves_no_checkpoint_behind(self, npz_data, tmp_path):
        _, _, data, model = npz_data
        target, link = tmp_path / "target.ckpt", tmp_path / "link.ckpt"
        link.symlink_to(target)
        assert main(["certify", str(model), str(data), "--out", str(tmp_path / "c.csv"), "--n", "40", "--n0", "10",
                     "--checkpoint", str(link)]) == 0
        assert not target.exists()

    def test_checkpoint_survives_a_failure_to_write_the_csv(self, npz_data, tmp_path, monkeypatch, capsys):
        _, _, data, model = npz_data
        plain, out, checkpoint = tmp_path / "plain.csv", tmp_path / "c.csv", tmp_path / "run.ckpt"
        common = ["--n", "40", "--n0", "10", "--checkpoint", str(checkpoint)]
        assert main(["certify", str(model), str(data), "--out", str(plain), *common]) == 0

        def disk_full(*args, **kwargs):
            raise OSError(28, "No space left on device")

        with monkeypatch.context() as patch:
            patch.setattr("smoothsk.cli.csv.writer", disk_full)
            assert main(["certify", str(model), str(data), "--out", str(out), *common]) == 2
        assert "No space left on device" in capsys.readouterr().err
        assert checkpoint.exists() and not out.exists()

        forbid(monkeypatch, _certification, "certify_rows",
               "certified again instead of reading the checkpoint")
        assert main(["certify", str(model), str(data), "--out", str(out), *common]) == 0
        assert out.read_text() == plain.read_text() and not checkpoint.exists()

    def test_out_dash_streams_the_csv_to_standard_output(self, npz_data, tmp_path, capsys, monkeypatch):
        _, _, data, model = npz_data
        monkeypatch.chdir(tmp_path)  # where a file named "-" would land
        common = [str(model), str(data), "--n", "40", "--n0", "10"]
        assert main(["certify", *common, "--out", "c.csv"]) == 0
        capsys.readouterr()
        assert main(["certify", *common, "--out", "-"]) == 0
        captured = capsys.readouterr()
        assert captured.out == (tmp_path / "c.csv").read_bytes().decode()  # the CSV alone, byte for byte
        assert "certificates" in captured.err and "standard output" in captured.err
        assert sorted(path.name for path in tmp_path.iterdir()) == ["c.csv"]


class TestSampleSizes:
    """``--n`` / ``--n0`` set those parameters of the model's own sampler, and are refused where it has none."""

    @staticmethod
    def model_with(npz_data, tmp_path, sampler):
        X, _, _, model = npz_data
        path, test = tmp_path / "model.safetensors", tmp_path / "test.npz"
        SampleWiseSmoothedClassifier.load(model).set_params(sampler=sampler).save(path)
        np.savez(test, X=X[:4])
        return path, test

    def test_n0_keeps_the_saved_sampler_and_its_other_parameters(self, npz_data, tmp_path):
        X, _, _, _ = npz_data
        sampler = SequentialSampler(n_max=300, first=60, n0=20)
        model, test = self.model_with(npz_data, tmp_path, sampler)
        out = tmp_path / "c.csv"
        assert main(["certify", str(model), str(test), "--out", str(out), "--n0", "10"]) == 0
        clf = SampleWiseSmoothedClassifier.load(model).set_params(sampler__n0=10)
        _, radius, details = clf.certify(X[:4], return_details=True)
        rows = read_csv(out)
        assert [float(row["radius"]) for row in rows] == radius.tolist()
        assert [int(row["n_samples"]) for row in rows] == details.n_samples.tolist()

    @pytest.mark.parametrize("sampler, option", [
        pytest.param(InputSpecificSampler(n_max=300), "--n0", id="iss-n0"),
        pytest.param(InputSpecificSampler(n_max=300), "--n", id="iss-n"),
        pytest.param(SequentialSampler(n_max=300), "--n", id="sequential-n"),
    ])
    def test_an_option_the_saved_sampler_lacks_is_refused(self, npz_data, tmp_path, capsys, sampler, option):
        model, test = self.model_with(npz_data, tmp_path, sampler)
        out = tmp_path / "c.csv"
        assert main(["certify", str(model), str(test), "--out", str(out), option, "50"]) == 2
        err = capsys.readouterr().err
        assert type(sampler).__name__ in err and f"no parameter {option[2:]!r}" in err
        assert not out.exists()


def bad_npz(tmp_path, kind):
    """An .npz (or other file) that ``fit`` must refuse, and the words its error must contain."""
    path = tmp_path / f"{kind}.npz"
    X, y = np.zeros((6, 4), dtype=np.float32), np.array([0, 1] * 3)
    if kind == "missing-X":
        np.savez(path, inputs=X, y=y)
        return path, "no array 'X'"
    if kind == "int-X":
        np.savez(path, X=X.astype(np.int64), y=y)
        return path, "X must be a float array"
    if kind == "lengths":
        np.savez(path, X=X, y=y[:5])
        return path, "X has 6 inputs but y has 5 labels"
    if kind == "float-y":
        np.savez(path, X=X, y=y + 0.5)
        return path, "y must be a 1-d array of integer, boolean or string labels"
    if kind == "nan":
        X[2, 1] = np.nan
        np.savez(path, X=X, y=y)
        return path, "NaN"
    if kind == "not-a-zip":
        path.write_bytes(b"these are not the arrays you are looking for")
        return path, "not a readable .npz file"
    if kind == "npy":
        path = tmp_path / "X.npy"
        np.save(path, X)
        return path, "not an .npz archive"
    if kind == "object":
        np.savez(path, X=np.array([X[0], "text", None], dtype=object), y=y[:3])
        return path, "Python objects"
    if kind == "bomb":  # 16 MiB of zeros in about 16 KiB
        np.savez_compressed(path, X=np.zeros((1 << 20, 4), dtype=np.float32), y=np.zeros(1 << 20, dtype=int))
        return path, "array 'X' inflates from"
    if kind == "claims-rows":  # a 200-byte file whose header declares 10**13 rows
        write_npz(path, {"X": npy_bytes(X[:1], shape=(10 ** 13, 4)), "y": y})
        return path, "array 'X' declares 160000000000000 bytes"
    if kind == "encrypted":
        write_npz(path, {"X": X, "y": y}, encrypted=("X",))
        return path, "array 'X' cannot be read"
    if kind == "float32-overflow":  # finite in float64, infinite as the float32 smoothsk computes in
        np.savez(path, X=np.where(X == 0, 1e300, X.astype(np.float64)), y=y)
        return path, "infinite"
    raise AssertionError(kind)


class TestBadFiles:
    @pytest.mark.parametrize("kind", ["missing-X", "int-X", "lengths", "float-y", "nan", "not-a-zip", "npy",
                                      "object", "bomb", "claims-rows", "encrypted", "float32-overflow"])
    def test_fit_refuses_a_bad_npz_in_one_line_naming_the_file(self, kind, tmp_path, capsys, monkeypatch):
        path, words = bad_npz(tmp_path, kind)
        out = tmp_path / "model.safetensors"
        forbid(monkeypatch, SampleWiseSmoothedClassifier, "fit", "trained on a file it should have refused")
        assert main(["fit", str(path), "--out", str(out), "--epochs", "1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"smoothsk fit: error: {path}: ")
        assert words in err
        assert not out.exists()

    @pytest.mark.parametrize("module", [[], ["--module", "flat-mlp"]], ids=["model file", "weights"])
    def test_a_model_file_larger_than_memory_is_refused_in_one_line(self, npz_data, tmp_path, capsys, module):
        _, _, data, _ = npz_data
        model = tmp_path / "sparse.safetensors"
        with open(model, "wb") as file:
            file.truncate(1 << 42)
        assert main(["certify", str(model), str(data), "--out", str(tmp_path / "c.csv"), *module]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert f"{model}: cannot read it (4398046511104 bytes, more than this machine's memory (" in err

    def test_certify_refuses_an_object_array_and_a_wrong_input_shape(self, npz_data, tmp_path, capsys):
        _, _, _, model = npz_data
        out = tmp_path / "c.csv"
        path, words = bad_npz(tmp_path, "object")
        assert main(["certify", str(model), str(path), "--out", str(out)]) == 2
        assert words in capsys.readouterr().err
        wrong = tmp_path / "wrong.npz"
        np.savez(wrong, X=np.zeros((3, 8), dtype=np.float32))
        assert main(["certify", str(model), str(wrong), "--out", str(out)]) == 2
        assert "inputs of shape (8,), but the model" in capsys.readouterr().err
        assert not out.exists()

    def test_certify_refuses_a_hostile_checkpoint_in_one_line(self, npz_data, tmp_path, capsys, monkeypatch):
        # The regression: a deeply nested JSON header was a RecursionError traceback.
        _, _, data, model = npz_data
        checkpoint = tmp_path / "run.ckpt"
        write_npz(checkpoint, {"header": np.frombuffer(b"[" * 100_000, dtype=np.uint8)})
        forbid(monkeypatch, _certification, "certify_rows", "certified despite the checkpoint")
        assert main(["certify", str(model), str(data), "--out", str(tmp_path / "c.csv"),
                     "--checkpoint", str(checkpoint)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"smoothsk certify: error: {checkpoint} is not a smoothsk")
        assert "checkpoint=" not in err  # the estimator's argument: a command-line user passes --checkpoint
        assert checkpoint.exists()

    @pytest.mark.parametrize("where", ["fit", "certify"])
    def test_debug_shows_the_error_s_traceback(self, npz_data, tmp_path, where):
        _, _, _, model = npz_data
        path, words = bad_npz(tmp_path, "claims-rows")
        inputs = [str(path)] if where == "fit" else [str(model), str(path)]
        with pytest.raises(ValueError, match=words):
            main([where, "--debug", *inputs, "--out", str(tmp_path / "out")])

    def test_certify_refuses_a_tampered_model_file(self, npz_data, tmp_path, capsys):
        _, _, data, model = npz_data
        tampered = tmp_path / "tampered.safetensors"
        content = bytearray(model.read_bytes())
        content[-5] ^= 0xFF  # a weight's byte: the stored digest no longer matches
        tampered.write_bytes(bytes(content))
        out = tmp_path / "c.csv"
        assert main(["certify", str(tampered), str(data), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"smoothsk certify: error: {tampered}: ")
        assert "digest" in err
        assert not out.exists()

    def test_certify_refuses_a_missing_model_file(self, npz_data, tmp_path, capsys):
        missing = tmp_path / "missing.safetensors"
        assert main(["certify", str(missing), str(npz_data[2]), "--out", str(tmp_path / "c.csv")]) == 2
        assert str(missing) in capsys.readouterr().err


@pytest.mark.parametrize("where", ["directory", "missing folder", "device"])
@pytest.mark.parametrize("command", ["fit", "certify"])
def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(command, where, npz_data, tmp_path,
                                                                          capsys, monkeypatch):
    # A device (/dev/stdout on a terminal, /dev/null) used to pass the check and fail only after the work.
    _, _, data, model = npz_data

    forbid(monkeypatch, SampleWiseSmoothedClassifier, command, "trained or certified before checking --out")
    if where == "directory":
        out = tmp_path / "results"
        out.mkdir()
    elif where == "device":
        out = Path(os.devnull)
    else:
        out = tmp_path / "no-such-folder" / "out"
    inputs = [str(data)] if command == "fit" else [str(model), str(data)]
    assert main([command, *inputs, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    if where == "directory":
        assert "--out" in err and str(out) in err and "is a directory" in err
    elif where == "device":
        assert f"--out {out}: cannot write it: it is not a regular file" in err
    else:
        assert "no-such-folder" in err


def test_a_checkpoint_folder_that_does_not_exist_is_refused_before_any_work(npz_data, tmp_path, capsys,
                                                                            monkeypatch):
    _, _, data, model = npz_data

    forbid(monkeypatch, SampleWiseSmoothedClassifier, "load", "loaded the model before checking --checkpoint")
    checkpoint = tmp_path / "no-such-folder" / "run.ckpt"
    assert main(["certify", str(model), str(data), "--out", str(tmp_path / "c.csv"),
                 "--checkpoint", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert "checkpoint" in err and "no-such-folder" in err and "does not exist" in err


def test_a_link_loop_as_a_path_is_refused_naming_its_option(npz_data, tmp_path, capsys):
    # The message was '[Errno 40] a symbolic link loop: ...', naming neither the option nor what was expected.
    _, _, data, model = npz_data
    loop = tmp_path / "run.ckpt"
    loop.symlink_to(loop)
    assert main(["certify", str(model), str(data), "--out", str(tmp_path / "c.csv"), "--checkpoint", str(loop)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--checkpoint {loop}: a symbolic link loop" in err


@pytest.fixture(scope="module")
def image_data(tmp_path_factory):
    """20 grey 4x4 images as PNGs in class folders ``0`` and ``1``, the .npz of their pixels, a model fitted on it.

    Returns
    -------
    folder : Path
        The images, ``<label>/<index>.png``.
    order : list of int
        The index of each image in the order the folder is read (by class, then name).
    data : Path
        The .npz of X (float32 (20, 1, 4, 4), the pixels / 255) and y.
    model : Path
    """
    root = tmp_path_factory.mktemp("images")
    pixels = np.random.default_rng(0).integers(0, 256, size=(20, 1, 4, 4), dtype=np.uint8)
    X = pixels.astype(np.float32) / 255
    y = (X.reshape(20, -1).mean(axis=1) > 0.5).astype(np.int64)
    for index, label in enumerate(y):
        (root / "folder" / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels[index, 0]).save(root / "folder" / str(label) / f"{index:02d}.png")
    np.savez(root / "data.npz", X=X, y=y)
    assert main(["fit", str(root / "data.npz"), "--out", str(root / "model.safetensors"), "--epochs", "1",
                 "--n", "60", "--n0", "10"]) == 0
    order = sorted(range(20), key=lambda index: (y[index], index))
    return root / "folder", order, root / "data.npz", root / "model.safetensors"


class TestOtherInputs:
    """``smoothsk certify`` reads a memory-mapped .npy and a folder of images as it reads the .npz of their values."""

    def test_an_npy_certifies_as_the_npz(self, npz_data, tmp_path):
        X, _, data, model = npz_data
        np.save(tmp_path / "X.npy", X)
        common = ["--n", "40", "--n0", "10"]
        assert main(["certify", str(model), str(data), "--out", str(tmp_path / "npz.csv"), *common]) == 0
        assert main(["certify", str(model), str(tmp_path / "X.npy"), "--out", str(tmp_path / "npy.csv"), *common]) == 0
        expected = [{key: value for key, value in row.items() if key not in ("y", "correct")}
                    for row in read_csv(tmp_path / "npz.csv")]
        assert read_csv(tmp_path / "npy.csv") == expected

    def test_a_folder_of_images_certifies_as_the_npz_of_its_pixels(self, image_data, tmp_path):
        folder, order, data, model = image_data
        assert main(["certify", str(model), str(data), "--out", str(tmp_path / "npz.csv")]) == 0
        assert main(["certify", str(model), str(folder), "--out", str(tmp_path / "images.csv")]) == 0
        expected = read_csv(tmp_path / "npz.csv")
        rows = read_csv(tmp_path / "images.csv")
        assert [row["y"] for row in rows] == [expected[index]["y"] for index in order]  # the class folders' names
        for name in ("prediction", "radius", "sigma", "n_samples", "guarantee"):
            assert [row[name] for row in rows] == [expected[index][name] for index in order], name

    def test_a_stateful_model_certifies_an_npy_whole_and_images_with_a_checkpoint_only(self, image_data, tmp_path,
                                                                                           capsys):
        folder, order, data, model = image_data
        stateful = tmp_path / "stateful.safetensors"
        SampleWiseSmoothedClassifier.load(model).set_params(allocator=OnlineBallAllocator()).save(stateful)
        X = np.load(data)["X"]
        np.save(tmp_path / "X.npy", X[order])  # in the folder's order
        np.savez(tmp_path / "ordered.npz", X=X[order])
        assert main(["certify", str(stateful), str(folder), "--out", str(tmp_path / "c.csv")]) == 2
        err = capsys.readouterr().err
        # The warning that regions are not saved, then the refusal.
        assert err.count("\n") == 2 and "allocates regions over all the inputs of a call together" in err
        for source, options in (("ordered.npz", []), ("X.npy", []), ("ordered.npz", ["--checkpoint", "a.ckpt"]),
                                (folder, ["--checkpoint", "b.ckpt"])):
            out = tmp_path / f"{Path(source).stem}-{len(options)}.csv"
            options = [option if option.startswith("--") else str(tmp_path / option) for option in options]
            assert main(["certify", str(stateful), str(tmp_path / source), "--out", str(out), *options]) == 0
        radii = {name: [row["radius"] for row in read_csv(tmp_path / f"{name}.csv")]
                 for name in ("ordered-0", "X-0", "ordered-2", "folder-2")}
        assert radii["X-0"] == radii["ordered-0"] and radii["folder-2"] == radii["ordered-2"]

    @pytest.mark.parametrize("content, words", [
        (npy_bytes(np.zeros((3, 16), np.int64)), "X must be a float array of shape (n_inputs, *input_shape); got dtype "
                                                 "int64"),
        (npy_bytes(np.array([None] * 3, dtype=object)), "not a readable .npy file (it holds Python objects"),
        (npy_bytes(np.zeros((3, 16), np.float32), shape=(10**9, 16)), "not a readable .npy file (it declares "
                                                                       "64000000000 bytes"),
        (npy_bytes(np.zeros((3, 8), np.float32)), "inputs of shape (8,), but the model"),
        (npy_bytes(np.full((3, 16), np.nan, np.float32)), "holds NaN or infinite values as float32"),
    ], ids=["integers", "objects", "declares more", "input shape", "nan"])
    def test_a_bad_npy_is_refused_in_one_line_naming_it(self, npz_data, tmp_path, capsys, monkeypatch, content, words):
        _, _, _, model = npz_data
        path = tmp_path / "bad.npy"
        path.write_bytes(content)
        forbid(monkeypatch, _certification, "certify_rows", "certified a file it should have refused")
        assert main(["certify", str(model), str(path), "--out", str(tmp_path / "c.csv")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err and words in err

    def test_an_npy_cut_short_while_it_is_certified_is_refused_in_one_line(self, npz_data, tmp_path, capsys,
                                                                          monkeypatch):
        X, _, _, model = npz_data
        path = tmp_path / "X.npy"
        np.save(path, X)
        certify = SampleWiseSmoothedClassifier.certify

        def cut_then_certify(self, *args, **kwargs):  # another process truncates the file in place once it is open
            os.truncate(path, 200)
            return certify(self, *args, **kwargs)

        monkeypatch.setattr(SampleWiseSmoothedClassifier, "certify", cut_then_certify)
        assert main(["certify", str(model), str(path), "--out", str(tmp_path / "c.csv")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{path}: changed while it was read" in err, err

    def test_an_npy_gone_once_its_magic_was_read_is_a_file_that_cannot_be_read(self, npz_data, tmp_path, capsys,
                                                                                 monkeypatch):
        X, _, _, model = npz_data
        path = tmp_path / "X.npy"
        np.save(path, X)

        def removed_first(name):  # another process deletes the file between the two opens
            os.remove(name)
            return NpyFile(name)

        monkeypatch.setattr(cli, "NpyFile", removed_first)
        assert main(["certify", str(model), str(path), "--out", str(tmp_path / "c.csv")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{path}: cannot read it (No such file or directory)." in err
        assert "np.save" not in err  # how to write an array does not help with a file that is gone

    @pytest.mark.parametrize("damage, words", [
        (lambda path: Image.new("L", (5, 4)).save(path), "4.png: 5x4 pixels, but the model takes 4x4."),
        (lambda path: path.write_bytes(b"GIF89a"), "4.png: not a PNG or JPEG image Pillow can read."),
    ], ids=["size", "not an image"])
    def test_a_bad_image_is_refused_in_one_line_naming_it_before_any_sampling(self, image_data, tmp_path, capsys,
                                                                               monkeypatch, damage, words):
        folder, _, _, model = image_data
        copy = tmp_path / "folder"
        shutil.copytree(folder, copy)
        damage(next(copy.glob("*/04.png")))
        forbid(monkeypatch, _certification, "certify_rows", "certified a folder it should have refused")
        assert main(["certify", str(model), str(copy), "--out", str(tmp_path / "c.csv")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"smoothsk certify: error: {copy}") and words in err

    def test_images_for_a_model_of_flat_inputs_are_refused(self, npz_data, image_data, tmp_path, capsys):
        folder, _, _, _ = image_data
        assert main(["certify", str(npz_data[3]), str(folder), "--out", str(tmp_path / "c.csv")]) == 2
        err = capsys.readouterr().err
        assert f"{folder}: a folder of images gives inputs of shape (channels, height, width)" in err


class TestStatefulAllocator:
    """Certificates of a stateful allocator are about the region classifier: ``--save-model`` keeps it."""

    @staticmethod
    def stateful_model(npz_data, tmp_path):
        X, _, _, model = npz_data
        path, test = tmp_path / "stateful.safetensors", tmp_path / "test.npz"
        SampleWiseSmoothedClassifier.load(model).set_params(allocator=OnlineBallAllocator()).save(path)
        np.savez(test, X=X[:8])
        return path, test

    def test_save_model_writes_the_regions_the_certificates_rely_on(self, npz_data, tmp_path, capsys):
        X, _, _, _ = npz_data
        model, test = self.stateful_model(npz_data, tmp_path)
        out, saved = tmp_path / "c.csv", tmp_path / "after.safetensors"
        assert main(["certify", str(model), str(test), "--out", str(out), "--n", "50", "--n0", "10",
                     "--save-model", str(saved)]) == 0
        assert "--save-model" not in capsys.readouterr().err
        clf = SampleWiseSmoothedClassifier.load(model).set_params(sampler__n=50, sampler__n0=10)
        _, radius = clf.certify(X[:8])
        assert [float(row["radius"]) for row in read_csv(out)] == radius.tolist()
        after = SampleWiseSmoothedClassifier.load(saved)
        assert len(after.regions_) == len(clf.regions_) > 0
        assert after.regions_.digest() == clf.regions_.digest()
        assert len(SampleWiseSmoothedClassifier.load(model).regions_) == 0  # the input file is left as it was

    def test_without_save_model_a_warning_says_the_regions_are_not_saved(self, npz_data, tmp_path, capsys):
        model, test = self.stateful_model(npz_data, tmp_path)
        assert main(["certify", str(model), str(test), "--out", str(tmp_path / "c.csv"), "--n", "50"]) == 0
        err = capsys.readouterr().err
        assert "warning" in err and "OnlineBallAllocator" in err and "--save-model" in err

    def test_a_stateless_allocator_gets_no_warning(self, npz_data, tmp_path, capsys):
        X, _, data, model = npz_data
        assert main(["certify", str(model), str(data), "--out", str(tmp_path / "c.csv"), "--n", "50"]) == 0
        assert "--save-model" not in capsys.readouterr().err

    @pytest.mark.parametrize("where", ["directory", "missing-folder"])
    def test_a_save_model_path_that_cannot_be_written_is_refused_before_any_work(self, where, npz_data, tmp_path,
                                                                               capsys, monkeypatch):
        _, _, data, model = npz_data

        forbid(monkeypatch, SampleWiseSmoothedClassifier, "load", "loaded the model before checking --save-model")
        target = tmp_path if where == "directory" else tmp_path / "no-such-folder" / "m.safetensors"
        assert main(["certify", str(model), str(data), "--out", str(tmp_path / "c.csv"),
                     "--save-model", str(target)]) == 2
        err = capsys.readouterr().err
        assert "--save-model" in err and str(target) in err



@pytest.mark.parametrize("case", ["checkpoint is out", "checkpoint is save-model", "checkpoint is the model",
                                  "out is the model", "out is the data", "fit out is the data"])
def test_two_options_naming_one_file_are_refused_before_any_work(case, npz_data, tmp_path, capsys, monkeypatch):
    # One path for two roles: writing one destroys the other (the checkpoint
    # used to be removed after the CSV or model had been written over it).
    _, _, data, model = npz_data
    copies = {"model": tmp_path / "model.safetensors", "data": tmp_path / "data.npz"}
    copies["model"].write_bytes(model.read_bytes())
    copies["data"].write_bytes(data.read_bytes())
    before = {path: path.read_bytes() for path in copies.values()}
    out, saved, checkpoint = tmp_path / "c.csv", tmp_path / "after.safetensors", tmp_path / "run.ckpt"
    same = {"checkpoint is out": ("--checkpoint", out, "--out"),
            "checkpoint is save-model": ("--checkpoint", saved, "--save-model"),
            "checkpoint is the model": ("--checkpoint", copies["model"], "the model"),
            "out is the model": ("--out", copies["model"], "the model"),
            "out is the data": ("--out", copies["data"], "the data"),
            "fit out is the data": ("--out", copies["data"], "the data")}
    option, path, other = same[case]
    paths = {"--out": out, "--save-model": saved, "--checkpoint": checkpoint, option: path}

    forbid(monkeypatch, SampleWiseSmoothedClassifier, "fit" if case.startswith("fit") else "certify",
           "worked before checking the paths")
    if case.startswith("fit"):
        argv = ["fit", str(copies["data"]), "--out", str(paths["--out"]), "--epochs", "1"]
    else:
        argv = ["certify", str(copies["model"]), str(copies["data"]), "--n", "40", "--n0", "10",
                *[item for name in ("--out", "--save-model", "--checkpoint") for item in (name, str(paths[name]))]]
    assert main(argv) == 2
    assert f"{option} {path}: the same file as {other}" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in copies.values()} == before


@pytest.mark.parametrize("role", ["the model", "the data", "--out", "--checkpoint", "fit --out"])
def test_a_symbolic_link_loop_is_refused_in_one_line_naming_it(role, npz_data, tmp_path, capsys, monkeypatch):
    _, _, data, model = npz_data
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    forbid(monkeypatch, SampleWiseSmoothedClassifier, "fit" if role == "fit --out" else "certify",
           "worked before checking the paths")
    paths = {"the model": model, "the data": data, "--out": tmp_path / "c.csv", "--checkpoint": tmp_path / "run.ckpt",
             role: loop}
    argv = (["fit", str(data), "--out", str(loop), "--epochs", "1"] if role == "fit --out" else
            ["certify", str(paths["the model"]), str(paths["the data"]), "--out", str(paths["--out"]),
             "--checkpoint", str(paths["--checkpoint"])])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(loop) in err and "symbolic link loop" in err, err


class TestKeyFile:
    def test_a_keyed_model_certifies_only_with_its_key(self, npz_data, tmp_path, capsys):
        X, y, data, _ = npz_data
        key, other = tmp_path / "key", tmp_path / "other"
        key.write_text("a" * 64 + "\n")
        other.write_text("b" * 64 + "\n")
        model, out = tmp_path / "keyed.safetensors", tmp_path / "c.csv"
        assert main(["fit", str(data), "--out", str(model), "--epochs", "1", "--n", "40", "--n0", "10",
                     "--key-file", str(key)]) == 0
        common = ["certify", str(model), str(data), "--out", str(out)]
        capsys.readouterr()
        assert main(common) == 2
        assert "authenticated with a key" in capsys.readouterr().err
        assert main([*common, "--key-file", str(other)]) == 2
        err = capsys.readouterr().err
        assert "not written with this key" in err and len(err.strip().splitlines()) == 1
        saved = tmp_path / "after.safetensors"
        assert main([*common, "--key-file", str(key), "--save-model", str(saved)]) == 0
        assert len(read_csv(out)) == len(X)
        SampleWiseSmoothedClassifier.load(saved, key=b"a" * 64)  # --save-model keeps the key

    def test_a_keyed_model_s_checkpoint_is_authenticated_with_its_key(self, npz_data, tmp_path, monkeypatch, capsys):
        _, _, data, _ = npz_data
        key = tmp_path / "key"
        key.write_text("a" * 64 + "\n")
        model, out, checkpoint = tmp_path / "keyed.safetensors", tmp_path / "c.csv", tmp_path / "run.ckpt"
        assert main(["fit", str(data), "--out", str(model), "--epochs", "1", "--n", "40", "--n0", "10",
                     "--key-file", str(key)]) == 0
        common = ["certify", str(model), str(data), "--out", str(out), "--checkpoint", str(checkpoint),
                  "--key-file", str(key)]
        def disk_full(*args, **kwargs):
            raise OSError(28, "No space left on device")

        with monkeypatch.context() as patch:  # the CSV cannot be written: the checkpoint is kept
            patch.setattr("smoothsk.cli.csv.writer", disk_full)
            assert main(common) == 2
        assert "hmac" in np.load(checkpoint).files
        capsys.readouterr()
        assert main(common) == 0 and not checkpoint.exists()

    def test_an_unkeyed_model_is_refused_with_a_key(self, npz_data, tmp_path, capsys):
        _, _, data, model = npz_data
        (tmp_path / "key").write_text("a" * 64)
        assert main(["certify", str(model), str(data), "--out", str(tmp_path / "c.csv"), "--key-file",
                     str(tmp_path / "key")]) == 2
        assert "not authenticated" in capsys.readouterr().err

    @pytest.mark.parametrize(("content", "match"), [(b"short\n", "a key must be 16 to 65536 bytes; the file holds 5"),
                                                    (None, "cannot read it")])
    def test_a_bad_key_file_is_refused_before_any_work(self, content, match, npz_data, tmp_path, capsys,
                                                       monkeypatch):
        _, _, data, _ = npz_data
        key = tmp_path / "key"
        if content is not None:
            key.write_bytes(content)
        forbid(monkeypatch, SampleWiseSmoothedClassifier, "fit", "trained before checking --key-file")
        assert main(["fit", str(data), "--out", str(tmp_path / "m.safetensors"), "--key-file", str(key)]) == 2
        assert match in capsys.readouterr().err


class TestTrainingOptions:
    """``smoothsk fit --sigma/--lr/--batch-size``: any fixed noise level, the optimiser's step and batch."""

    def test_any_fixed_sigma_trains_and_certifies_at_that_sigma(self, npz_data, tmp_path, capsys):
        X, _, data, _ = npz_data
        model, out = tmp_path / "m.safetensors", tmp_path / "c.csv"
        assert main(["fit", str(data), "--out", str(model), "--epochs", "1", "--sigma", "1.0", "--n", "40",
                     "--n0", "10"]) == 0
        assert "Cohen sigma=1" in capsys.readouterr().out
        clf = SampleWiseSmoothedClassifier.load(model)
        assert isinstance(clf.training, FixedSigmaTraining) and clf.training.sigma == 1.0
        np.testing.assert_array_equal(clf.train_sigmas_, 1.0)
        assert main(["certify", str(model), str(data), "--out", str(out)]) == 0
        assert {float(row["sigma"]) for row in read_csv(out)} == {1.0}

    def test_lr_and_batch_size_are_the_estimator_s(self, npz_data, tmp_path):
        _, _, data, _ = npz_data
        model = tmp_path / "m.safetensors"
        assert main(["fit", str(data), "--out", str(model), "--epochs", "1", "--lr", "0.01", "--batch-size", "16",
                     "--preset", "cohen-0.5"]) == 0
        clf = SampleWiseSmoothedClassifier.load(model)
        assert (clf.lr, clf.batch_size, clf.training.sigma) == (0.01, 16, 0.5)

    def test_the_presets_keep_their_settings(self, npz_data):
        clf = SampleWiseSmoothedClassifier.load(npz_data[3])  # fitted with no --preset, --lr or --batch-size
        assert (clf.lr, clf.batch_size, clf.training.sigma) == (0.05, 64, 0.25)

    @pytest.mark.parametrize("options, words", [
        (["--sigma", "0"], "--sigma 0.0: the training noise level must be a finite number > 0"),
        (["--sigma", "nan"], "--sigma nan: the training noise level must be a finite number > 0"),
        (["--sigma", "1.0", "--preset", "pfat"], "--sigma 1.0: trains one fixed noise level (Cohen et al.)"),
        (["--lr", "-0.1"], "--lr -0.1: the learning rate must be a finite number > 0"),
        (["--batch-size", "0"], "--batch-size 0: the training batch size must be >= 1"),
        (["--normalize", "0.5"], "--normalize 0.5: give MEAN,...:STD,..."),
        (["--normalize", "0.5:x"], "--normalize 0.5:x: give MEAN,...:STD,..."),
        (["--normalize", "0.5:0"], "--normalize 0.5:0: std must be > 0 for every channel"),
        (["--normalize", "0.1,0.2:0.3"], "--normalize 0.1,0.2:0.3: mean and std must have one value per channel"),
        (["--normalize", "0.5:0.5", "--module", "cifar-resnet"],
         "--normalize 0.5:0.5: cifar-resnet normalizes its inputs itself"),
    ])
    def test_bad_options_are_refused_in_one_line_before_any_work(self, options, words, tmp_path, capsys,
                                                                 monkeypatch):
        forbid(monkeypatch, SampleWiseSmoothedClassifier, "fit", "trained despite a bad option")
        missing = tmp_path / "no-such-data.npz"  # read after the options are checked: its error would come first
        assert main(["fit", str(missing), "--out", str(tmp_path / "m.safetensors"), *options]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("smoothsk fit: error: ") and words in err


class TestNormalizeOption:
    """``--normalize MEAN,..:STD,..``: a normalisation in front of the module, noise added before it."""

    def test_fit_trains_a_normalized_module_that_loads_alone(self, npz_data, tmp_path):
        X, _, data, _ = npz_data
        model = tmp_path / "m.safetensors"
        assert main(["fit", str(data), "--out", str(model), "--epochs", "1", "--normalize", "0.5:0.25"]) == 0
        clf = SampleWiseSmoothedClassifier.load(model)
        assert clf.module is Normalized and clf.get_params_for("module") == {"net": FlatMLP, "mean": (0.5,),
                                                                             "std": (0.25,)}

    def test_fit_refuses_statistics_for_another_number_of_channels_before_training(self, npz_data, tmp_path,
                                                                                   capsys, monkeypatch):
        _, _, data, _ = npz_data
        forbid(monkeypatch, SampleWiseSmoothedClassifier, "fit", "trained despite a bad --normalize")
        assert main(["fit", str(data), "--out", str(tmp_path / "m.safetensors"), "--normalize", "0.1,0.2:1,1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert f"--normalize 0.1,0.2:1,1: 2 channel values, but the inputs of {data} have shape (16,)" in err

    def test_certify_puts_the_normalization_in_front_of_the_loaded_module(self, npz_data, tmp_path):
        X, _, data, model = npz_data
        out, saved = tmp_path / "c.csv", tmp_path / "normalized.safetensors"
        assert main(["certify", str(model), str(data), "--out", str(out), "--n", "50", "--n0", "10",
                     "--normalize", "0.1:2.0", "--save-model", str(saved)]) == 0
        clf = SampleWiseSmoothedClassifier.load(model).set_params(sampler__n=50, sampler__n0=10)
        clf.module = clf.module_ = Normalized(clf.module_, 0.1, 2.0)
        prediction, radius = clf.certify(X)
        rows = read_csv(out)
        assert [float(row["radius"]) for row in rows] == radius.tolist()
        assert [int(row["prediction"]) for row in rows] == prediction.tolist()
        plain = SampleWiseSmoothedClassifier.load(model).set_params(sampler__n=50, sampler__n0=10)
        assert plain.certify(X)[1].tolist() != radius.tolist()  # the normalization changes the classifier
        again = SampleWiseSmoothedClassifier.load(saved)  # no module argument
        assert again.module is Normalized and again.get_params_for("module")["std"] == (2.0,)
        assert again.set_params(sampler__n=50, sampler__n0=10).certify(X)[1].tolist() == radius.tolist()

    @pytest.mark.parametrize("case, words", [
        ("twice", "--normalize 0.1:2.0: the model {model} already normalizes its inputs"),
        ("channels", "--normalize 0.1,0.2:1,1: 2 channel values, but the model {model} takes inputs of shape "
                     "(16,)"),
    ])
    def test_certify_refuses_a_normalization_that_cannot_apply(self, case, words, npz_data, tmp_path, capsys,
                                                               monkeypatch):
        _, _, data, model = npz_data
        if case == "twice":
            normalized = tmp_path / "normalized.safetensors"
            assert main(["fit", str(data), "--out", str(normalized), "--epochs", "1", "--normalize", "0:1"]) == 0
            model, option = normalized, "0.1:2.0"
        else:
            option = "0.1,0.2:1,1"
        capsys.readouterr()
        forbid(monkeypatch, SampleWiseSmoothedClassifier, "certify", "certified despite a bad --normalize")
        assert main(["certify", str(model), str(data), "--out", str(tmp_path / "c.csv"), "--normalize",
                     option]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words.format(model=model) in err


class TestSummary:
    """With labels, ``certify`` prints a summary (accuracy, certified accuracy, ACR, time); its CSV marks hits."""

    def test_summary_figures_are_those_of_smoothsk_metrics(self, npz_data, tmp_path, capsys):
        from smoothsk.metrics import average_certified_radius, certified_accuracy_curve

        _, y, data, model = npz_data
        out = tmp_path / "c.csv"
        assert main(["certify", str(model), str(data), "--out", str(out), "--n", "50", "--n0", "10"]) == 0
        report = capsys.readouterr().out
        rows = read_csv(out)
        prediction = np.array([int(row["prediction"]) for row in rows])
        radius = np.array([float(row["radius"]) for row in rows])
        curve = certified_accuracy_curve(y, prediction, radius, SUMMARY_RADII)
        assert f"clean accuracy: {np.mean(prediction == y):.3f}" in report
        assert "certified accuracy at radius " + "  ".join(f"{r:g}: {a:.3f}" for r, a in
                                                          zip(SUMMARY_RADII, curve, strict=True)) in report
        assert f"average certified radius (ACR): {average_certified_radius(y, prediction, radius):.4f}" in report
        assert "seconds per input: " in report
        assert curve[0] > curve[-1]  # the figures vary: a wrong format could not pass

    def test_correct_column_is_one_where_the_prediction_is_the_label(self, npz_data, tmp_path):
        _, y, data, model = npz_data
        out = tmp_path / "c.csv"
        # Few samples: some inputs abstain (prediction -1), which is never correct.
        assert main(["certify", str(model), str(data), "--out", str(out), "--n", "12", "--n0", "10"]) == 0
        rows = read_csv(out)
        assert list(rows[0])[-2:] == ["y", "correct"]
        prediction = np.array([int(row["prediction"]) for row in rows])
        wrong = (prediction != y) & (prediction != ABSTAIN)
        assert np.any(prediction == ABSTAIN) and np.any(prediction == y) and np.any(wrong)
        assert [row["correct"] for row in rows] == [str(int(p == label)) for p, label in zip(prediction, y,
                                                                                             strict=True)]

    def test_string_labels_are_compared_as_labels(self, tmp_path):
        from smoothsk.datasets import make_heterogeneous_margins
        X, y = make_heterogeneous_margins(n_samples=60, n_features=16, random_state=0)
        names = np.array([f"class {label}" for label in y])
        data, model, out = tmp_path / "d.npz", tmp_path / "m.safetensors", tmp_path / "c.csv"
        np.savez(data, X=X, y=names)
        assert main(["fit", str(data), "--out", str(model), "--epochs", "2", "--n", "50", "--n0", "10"]) == 0
        assert main(["certify", str(model), str(data), "--out", str(out)]) == 0
        rows = read_csv(out)
        assert [row["correct"] for row in rows] == [str(int(row["prediction"] == row["y"])) for row in rows]
        assert {row["correct"] for row in rows} == {"0", "1"}

    def test_without_labels_no_summary_and_neither_y_nor_correct(self, npz_data, tmp_path, capsys):
        X, _, _, model = npz_data
        test, out = tmp_path / "test.npz", tmp_path / "c.csv"
        np.savez(test, X=X[:5])
        assert main(["certify", str(model), str(test), "--out", str(out), "--n", "40", "--n0", "10"]) == 0
        assert list(read_csv(out)[0]) == ["index", "prediction", "radius", "sigma", "n_samples", "guarantee"]
        report = capsys.readouterr().out
        assert "accuracy" not in report and "no labels" in report

    def test_with_out_dash_the_summary_goes_to_standard_error(self, npz_data, capsys):
        _, _, data, model = npz_data
        assert main(["certify", str(model), str(data), "--out", "-", "--n", "40", "--n0", "10"]) == 0
        captured = capsys.readouterr()
        assert "clean accuracy" in captured.err and "accuracy" not in captured.out


class TestWeightsTrainedElsewhere:
    """``smoothsk certify WEIGHTS DATA --module NAME``: a network's state_dict from elsewhere, certified as it is."""

    @pytest.fixture(scope="class")
    def weights(self, npz_data, tmp_path_factory):
        import torch
        from safetensors.torch import save_file

        torch.manual_seed(0)
        network = FlatMLP(n_classes=2)
        X, y, _, _ = npz_data
        network(torch.from_numpy(X[:1]))
        path = tmp_path_factory.mktemp("weights") / "weights.safetensors"
        save_file({name: value.contiguous() for name, value in network.state_dict().items()}, str(path))
        return network, path

    def test_certificates_are_those_of_from_module_with_the_same_weights(self, npz_data, weights, tmp_path):
        X, y, data, _ = npz_data
        network, path = weights
        out = tmp_path / "c.csv"
        assert main(["certify", str(path), str(data), "--module", "flat-mlp", "--sigma", "0.5", "--classes", "0,1",
                     "--out", str(out), "--n", "50", "--n0", "10"]) == 0
        rows = read_csv(out)
        clf = SampleWiseSmoothedClassifier.from_module(network, input_shape=X.shape[1:], sigma=0.5,
                                                       classes=np.array([0, 1]), random_state=0)
        prediction, radius = clf.set_params(sampler__n=50, sampler__n0=10).certify(X)
        assert [int(row["prediction"]) for row in rows] == prediction.tolist()
        np.testing.assert_array_equal([float(row["radius"]) for row in rows], radius)
        assert {row["sigma"] for row in rows} == {"0.5"}

    def test_a_folder_of_images_needs_a_network_of_a_fixed_input_shape(self, weights, image_data, tmp_path, capsys):
        folder, _, _, _ = image_data
        _, path = weights
        assert main(["certify", str(path), str(folder), "--module", "flat-mlp", "--out", str(tmp_path / "c.csv")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{folder}: a folder of images" in err and "--module flat-mlp" in err

    @pytest.mark.parametrize("options, words", [
        (["--module", "lenet"], "--module lenet"),  # another architecture's names and shapes
        (["--module", "flat-mlp", "--classes", "0,1,2"], "shape"),  # three logits, the weights have two
        (["--module", "flat-mlp", "--classes", "1,0"], "--classes 1,0"),
        (["--sigma", "0.5"], "--sigma and --classes describe a network given by --module"),
        (["--module", "flat-mlp", "--sigma", "-1"], "--sigma -1"),
    ])
    def test_wrong_weights_or_options_are_refused_in_one_line(self, npz_data, weights, tmp_path, capsys, options,
                                                              words):
        _, _, data, _ = npz_data
        _, path = weights
        assert main(["certify", str(path), str(data), "--out", str(tmp_path / "c.csv"), *options]) != 0
        error = capsys.readouterr().err.strip()
        assert words in error and len(error.splitlines()) == 1
        assert not (tmp_path / "c.csv").exists()

    def test_a_file_that_is_not_safetensors_is_refused_naming_it(self, npz_data, tmp_path, capsys):
        _, _, data, _ = npz_data
        bogus = tmp_path / "weights.safetensors"
        bogus.write_bytes(b"\xff" * 64)
        assert main(["certify", str(bogus), str(data), "--module", "flat-mlp", "--out", str(tmp_path / "c.csv")]) != 0
        error = capsys.readouterr().err.strip()
        assert str(bogus) in error and len(error.splitlines()) == 1
