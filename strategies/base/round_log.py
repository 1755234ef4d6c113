"""The human round line and the run's elapsed time, from the round records."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def run_elapsed(history: Sequence[Mapping[str, Any]]) -> float:
    """Seconds the run took up to its last recorded round, over all its segments (a resumed run
    adds its own): the last record's ``run_elapsed_s``, or the rounds' times in older records."""
    if not history:
        return 0.0
    if "run_elapsed_s" in history[-1]:
        return float(history[-1]["run_elapsed_s"])
    return float(sum(r.get("round_time_s", 0.0) for r in history))


def id_list(ids: Sequence[int], most: int = 12) -> str:
    shown = ", ".join(map(str, ids[:most]))
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")


def format_value(value: Any) -> str:
    """A diagnostic on the round line: floats to 4 significant digits, lists of them too."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return str(value)


def format_round(record: Mapping[str, Any], num_rounds: int) -> str:
    """One human line per round, printed while the run goes."""

    def pct(key: str) -> str:
        return f"{100 * record[key]:6.2f}%" if key in record else "   n/a "

    extra = "".join(f" | {k} {format_value(record[k])}" for k in record.get("log_keys", []))
    return (
        f"[round {record['round']:>3}/{num_rounds}] test_before {pct('test_before_acc')} "
        f"test_after {pct('test_after_acc')} | clients {len(record['clients'])}"
        f"{' (-' + str(len(record['dropped'])) + ' dropped)' if record['dropped'] else ''} | "
        f"down {record['bytes_down'] / 2**20:.3f} MiB up {record['bytes_up'] / 2**20:.3f} MiB | "
        f"{record.get('round_time_s', 0):.1f}s{extra}"
    )
