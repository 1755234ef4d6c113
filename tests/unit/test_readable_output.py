"""What a person reads: round lines and summary tables with short numbers, plots without half rounds."""

from __future__ import annotations

from pathlib import Path

from pflower.server_app.results import plot_accuracy
from pflower.server_app.runner import summary_table
from pflower.strategies.base.round_log import format_round, format_value

RECORD = {
    "round": 3,
    "clients": [0, 1],
    "dropped": [],
    "bytes_down": 2**20,
    "bytes_up": 2**20,
    "round_time_s": 1.25,
    "test_before_acc": 0.5,
    "mean_client_acc": 0.47178192807832264,
    "self_weight_by_layer": [0.1234567, 0.98765432],
    "log_keys": ["mean_client_acc", "self_weight_by_layer"],
}


def test_round_line_shows_diagnostics_to_four_significant_digits():
    line = format_round(RECORD, 5)
    assert "mean_client_acc 0.4718" in line and "self_weight_by_layer [0.1235, 0.9877]" in line
    assert "0.47178192807832264" not in line
    assert format_value(3) == "3" and format_value("fc2") == "fc2"


def test_summary_table_shortens_float_lists():
    table = summary_table({"self_weight_by_layer": [0.1234567, 0.98765432], "final_acc": 0.5})
    assert "| self_weight_by_layer | [0.1235, 0.9877] |" in table and "| final_acc | 50.00% |" in table


def test_a_short_runs_plot_has_whole_rounds_only(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.ticker import MaxNLocator

    rounds = [{"round": r, "test_before_acc": 0.1 * r} for r in (1, 2, 3)]
    captured = {}
    import matplotlib.figure

    original = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):  # the axis as drawn, before the figure is closed
        ax = fig.axes[0]
        captured["locator"] = ax.xaxis.get_major_locator()
        captured["ticks"] = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        return original(fig, *args, **kwargs)

    matplotlib.figure.Figure.savefig = keep
    try:
        plot_accuracy(rounds, Path(tmp_path) / "a.png", "t")
    finally:
        matplotlib.figure.Figure.savefig = original
    assert isinstance(captured["locator"], MaxNLocator)
    assert captured["ticks"] and all(float(t).is_integer() for t in captured["ticks"]), captured["ticks"]


def test_summary_table_names_a_per_client_mapping_instead_of_printing_it():
    per_client = {str(i): 0.5 for i in range(100)}
    table = summary_table({"final_client_acc": per_client, "small": {"a": 1}})
    assert "| final_client_acc | 100 entries, in summary.json |" in table
    assert "| small | {'a': 1} |" in table  # a short mapping is still shown
