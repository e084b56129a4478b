"""The smoothsk command line."""

import numpy as np
import pytest

from smoothsk.cli import build_parser, demo_methods, main, markdown_table


def test_markdown_table_has_one_row_per_method_and_a_column_per_radius():
    table = markdown_table([("a", np.array([1.0, 0.5]), 0.25, 1.0), ("b", np.array([0.5, 0.0]), 0.1, 2.0)], (0, 0.5))
    lines = table.splitlines()
    assert lines[0] == "| method | r=0 | r=0.5 | ACR | time (s) |"
    assert lines[2] == "| a | 1.000 | 0.500 | 0.250 | 1.0 |" and len(lines) == 4


def test_demo_methods_train_for_the_same_total_epochs():
    methods = demo_methods(epochs=10, search_n=100)
    assert {"Cohen sigma=0.25", "Cohen sigma=0.5"} <= set(methods)
    pfat = next(params for name, params in methods.items() if name.startswith("PFAT"))["training"]
    insta = next(params for name, params in methods.items() if name.startswith("Insta-RS"))["training"]
    assert pfat.pretrain_epochs + pfat.finetune_epochs == 10
    assert insta.stage1_epochs + insta.stage2_epochs == 10


def test_demo_runs_end_to_end_and_saves_the_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "curves.png"
    assert main(["demo", "--epochs", "1", "--n", "40", "--n0", "10", "--methods", "cohen",
                 "--test-size", "0.05", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "| Cohen sigma=0.25 |" in out and "| Cohen sigma=0.5 |" in out and "PFAT" not in out
    assert plot.exists() and plot.stat().st_size > 1000


def test_unknown_command_is_refused():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train"])
