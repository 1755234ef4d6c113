"""How a method's mechanism is drawn: the per-round diagnostics a strategy declares (its
``diagnostic_panels``), which ``pflower report`` plots for every run of that method."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Panel:
    """One per-round diagnostic of a method's mechanism: ``key`` in metrics.jsonl (a number, or
    a list of numbers drawn as one line per entry, e.g. per layer), its axis label, the method
    option drawn as a dashed threshold, and the record key whose truthy rounds get a dot.
    ``threshold_key``: a record key holding the threshold the run actually compared with, drawn
    instead of the option where a run logged it (an option read relative to the data)."""

    key: str
    label: str
    threshold: str | None = None
    events: str | None = None
    threshold_key: str | None = None
