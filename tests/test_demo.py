"""smoothsk demo: one row per method under a stated guarantee, the notes under the table, --out."""

import csv
import sys

import numpy as np
import pytest
import torch

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk._demo import GUARANTEES, QUICK, guarantee_words, radius_cap, resolve_settings, run_demo
from smoothsk._presets import PRESETS
from smoothsk.cli import build_parser, main
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import FixedSigma
from smoothsk.training import FixedSigmaTraining

from conftest import forbid

#: --quick, shrunk further for the suite (same code path: only the sizes differ).
TINY = ["--quick", "--epochs", "1", "--n", "40", "--n0", "10", "--search-n", "40", "--test-size", "0.03",
        "--train-size", "300"]
#: The guarantee each preset's row must state (its allocator and sigma function decide it).
EXPECTED_GUARANTEE = {
    "cohen-0.25": "full", "cohen-0.5": "full", "pfat": "stateful regions", "ddrs": "stateful regions",
    "insta-rs": "own-sigma only (not for the sample-wise classifier)",
    "selector": "sample-wise classifier G, stateless",
}


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    """Rows, stdout and output folder of one small ``--quick`` demo of every method."""
    pytest.importorskip("matplotlib")
    folder = tmp_path_factory.mktemp("demo")
    rows = run_demo(build_parser().parse_args(["demo", *TINY, "--out", str(folder)]))
    return rows, folder


def test_every_preset_gets_a_row_with_finite_numbers_and_its_guarantee(quick_demo):
    rows, _ = quick_demo
    assert [row.name for row in rows] == [preset.name for preset in PRESETS.values()]
    for preset_id, row in zip(PRESETS, rows, strict=True):
        assert guarantee_words(row.guarantee) == EXPECTED_GUARANTEE[preset_id], preset_id
        numbers = [*row.curve((0.0, 0.25, 0.5)), row.acr, row.samples, row.train_seconds, row.certify_seconds]
        assert np.all(np.isfinite(numbers)), preset_id
        assert len(row.radius) == len(row.y_true) == len(row.sigma) > 0


def test_no_fixed_sigma_radius_exceeds_the_stated_cap(quick_demo):
    rows, _ = quick_demo
    cap = radius_cap(40, 0.001)
    for row in rows[:2]:  # Cohen: one sigma, n = 40 estimation samples at alpha
        assert np.all(row.radius <= row.sigma * cap)


def test_out_holds_the_table_as_markdown_and_csv_and_two_pictures(quick_demo):
    rows, folder = quick_demo
    markdown = (folder / "results.md").read_text()
    assert markdown.startswith("| method | r=0 |") and "How to read this:" in markdown
    assert f"sigma x {radius_cap(40, 0.001):.2f}" in markdown
    with open(folder / "results.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert [entry["method"] for entry in table] == [row.name for row in rows]
    assert [entry["guarantee statement"] for entry in table] == [row.guarantee for row in rows]
    for picture in ("certified_accuracy.png", "sigma_histogram.png"):
        content = (folder / picture).read_bytes()
        assert content.startswith(b"\x89PNG") and len(content) > 1000


def test_radius_cap_is_what_certify_gives_when_every_sample_agrees():
    class Constant(torch.nn.Module):
        """Class 0 everywhere: every noisy sample votes for it."""

        def __init__(self):
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(()))  # something for the optimizer to hold

        def forward(self, x):
            ones = x.new_ones(len(x))
            return torch.stack([ones, 0 * ones + self.unused], dim=1)

    X, y = np.zeros((4, 3), dtype=np.float32), np.array([0, 1, 0, 1])
    clf = SampleWiseSmoothedClassifier(Constant(), training=FixedSigmaTraining(0.5), sigma_search=FixedSigma(0.5),
                                       sampler=FixedSampler(n=100, n0=10), max_epochs=0, random_state=0)
    _, radius = clf.fit(X, y).certify(X)
    np.testing.assert_allclose(radius, 0.5 * radius_cap(100, clf.alpha), rtol=1e-12)
    assert radius_cap(1000, 0.001) == pytest.approx(2.46, abs=0.005)  # the cap the issue quotes


def test_iss_sampler_and_a_machine_without_matplotlib(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    args = ["demo", *TINY, "--n", "200", "--methods", "cohen-0.25", "--sampler", "iss", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "InputSpecificSampler(n_max=200)" in out and "| Cohen sigma=0.25 |" in out
    assert "pip install 'smoothsk[plot]'" in out
    assert (tmp_path / "results.csv").exists() and not list(tmp_path.glob("*.png"))


def test_unknown_methods_are_refused_in_one_line(tmp_path, capsys):
    assert main(["demo", "--methods", "cohen,nope", "--out", str(tmp_path)]) == 2
    assert "unknown ['nope']" in capsys.readouterr().err


def test_options_override_the_quick_settings_one_by_one():
    settings = resolve_settings(build_parser().parse_args(["demo", "--quick", "--n", "77"]))
    assert settings["n"] == 77 and settings["epochs"] == QUICK["epochs"] and settings["sampler"] == "fixed"


def test_unknown_guarantee_statements_are_shown_as_they_are():
    assert guarantee_words("some future classifier") == "some future classifier"
    assert set(EXPECTED_GUARANTEE.values()) == set(GUARANTEES)


@pytest.fixture
def no_training(monkeypatch):
    """Make any training fail the test: the demo's options must be refused before it."""
    forbid(monkeypatch, SampleWiseSmoothedClassifier, "fit", "trained before refusing the options")


@pytest.mark.parametrize("option, value", [("--epochs", "-3"), ("--epochs", "0"), ("--search-n", "0"),
                                           ("--n", "0"), ("--n0", "-1"), ("--train-size", "0"), ("--alpha", "0"),
                                           ("--alpha", "1.5"), ("--seed", "-1")])
def test_a_setting_out_of_range_is_refused_before_any_training(option, value, no_training, tmp_path, capsys):
    args = ["demo", *TINY, "--methods", "cohen-0.25,pfat", option, value, "--out", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("smoothsk demo: error: ") and f"{option} must be" in err and value in err


def test_a_later_method_that_refuses_its_settings_stops_the_run_before_the_first_trains(no_training, tmp_path,
                                                                                      capsys, monkeypatch):
    from smoothsk.sigma import GridSigmaSearch

    def refused(self):
        raise ValueError("n must be at least 1")  # a parameter check of PFAT's search, not of the first method

    monkeypatch.setattr(GridSigmaSearch, "validate", refused)
    args = ["demo", *TINY, "--methods", "cohen-0.25,pfat", "--out", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "pfat" in err and "n must be at least 1" in err


def test_an_out_that_is_a_file_is_refused_before_any_training(no_training, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    assert main(["demo", *TINY, "--methods", "cohen-0.25", "--out", str(afile)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and str(afile) in err and "not a folder" in err
    assert afile.read_text() == "keep me"

