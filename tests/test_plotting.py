"""smoothsk.plotting, headless (Agg)."""

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt

from smoothsk import ABSTAIN
from smoothsk.metrics import certified_accuracy_curve
from smoothsk.plotting import plot_certified_accuracy, plot_sigma_histogram


@pytest.fixture
def results():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 50)
    wrong = np.where(rng.random(50) < 0.3, (y + 1) % 3, y)
    abstain = np.where(rng.random(50) < 0.2, ABSTAIN, y)
    return {"a": (y, wrong, rng.uniform(0, 1.5, 50)), "b": (y, abstain, rng.uniform(0, 0.8, 50))}


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


class TestPlotCertifiedAccuracy:
    def test_one_line_per_method_with_the_certified_accuracy_curve(self, results):
        radii = np.linspace(0, 2, 41)
        ax = plot_certified_accuracy(results, radii=radii)
        assert isinstance(ax, matplotlib.axes.Axes)
        lines = ax.get_lines()
        assert [line.get_label() for line in lines] == ["a", "b"]
        for line, (y, prediction, radius) in zip(lines, results.values(), strict=True):
            np.testing.assert_array_equal(line.get_xdata(), radii)
            np.testing.assert_array_equal(line.get_ydata(), certified_accuracy_curve(y, prediction, radius, radii))

    def test_default_radii_reach_the_largest_certified_radius(self, results):
        ax = plot_certified_accuracy(results)
        largest = max(radius.max() for _, _, radius in results.values())
        for line in ax.get_lines():
            assert line.get_xdata()[0] == 0 and line.get_xdata()[-1] == max(1.0, largest)

    def test_draws_into_given_axes_and_saves_a_png(self, results, tmp_path):
        fig, ax = plt.subplots()
        assert plot_certified_accuracy(results, ax=ax) is ax
        path = tmp_path / "curves.png"
        fig.savefig(path)
        assert path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    @pytest.mark.parametrize("bad", [{}, {"a": (np.zeros(3), np.zeros(3))}, [(0, 0, 0)]])
    def test_malformed_results_are_refused(self, bad):
        with pytest.raises(ValueError, match="results"):
            plot_certified_accuracy(bad)


class TestPlotSigmaHistogram:
    def test_one_histogram_per_method_counting_every_input(self, tmp_path):
        sigmas = {"fixed": np.full(20, 0.25), "sample-wise": np.linspace(0.1, 1.0, 30)}
        ax = plot_sigma_histogram(sigmas, bins=10)
        assert isinstance(ax, matplotlib.axes.Axes)
        assert [patch.get_label() for patch in ax.patches] == ["fixed", "sample-wise"]
        _, labels = ax.get_legend_handles_labels()
        assert labels == ["fixed", "sample-wise"]
        path = tmp_path / "sigmas.png"
        ax.figure.savefig(path)
        assert path.stat().st_size > 1000

    def test_counts_equal_the_inputs_per_bin(self):
        sigmas = {"m": np.array([0.1, 0.1, 0.3, 0.5, 0.5, 0.5])}
        edges = np.array([0.0, 0.2, 0.4, 0.6])
        ax = plot_sigma_histogram(sigmas, bins=edges)
        # A step histogram's outline visits each bin's height twice.
        heights = ax.patches[0].get_xy()[1:-1:2, 1]
        np.testing.assert_array_equal(heights, [2, 1, 3])

    def test_non_finite_sigmas_are_refused(self):
        with pytest.raises(ValueError, match=r"sigmas\['m'\]"):
            plot_sigma_histogram({"m": [0.1, np.nan]})
