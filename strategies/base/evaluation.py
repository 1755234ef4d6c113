"""The papers' evaluation protocol, as plain functions over per-client metrics.

Each sampled client reports ``test_before`` (the model it received, on its own test
split, before training) and ``test_after``. A round's number is the sample-weighted
mean over the round's clients; the headline is the mean of the last 10 rounds'
``test_before_acc`` (FedCMD paper, evaluation protocol). Metric names are the same for every method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from pflower.protocol.wire import GLOBAL_TEST_SIZE, TEST_SIZE

PHASES = ("test_before", "test_after")


def weighted_test_metrics(client_metrics: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Sample-weighted accuracy/loss for each phase: sum(correct) / sum(test samples)."""
    out: dict[str, float] = {}
    total = sum(m["test_size"] for m in client_metrics)
    for phase in PHASES:
        present = [m for m in client_metrics if f"{phase}_correct" in m]
        if not present or total <= 0:
            continue
        n = sum(m["test_size"] for m in present)
        out[f"{phase}_acc"] = sum(m[f"{phase}_correct"] for m in present) / n
        out[f"{phase}_loss"] = sum(m[f"{phase}_loss_sum"] for m in present) / n
    after = [
        m["test_after_correct"] / m["test_size"]
        for m in client_metrics
        if m.get("test_size") and "test_after_correct" in m
    ]
    if after:
        # the unweighted mean over the round's clients of their trained models' accuracy (KAPC's
        # round metric; its "best mean accuracy" is the best round's): every method records it
        out["mean_client_acc"] = float(np.mean(after))
    if client_metrics and all("train_loss" in m for m in client_metrics):
        weights = [m["num-examples"] for m in client_metrics]
        out["train_loss"] = float(np.average([m["train_loss"] for m in client_metrics], weights=weights))
    return out


# what a client reports -> the round's total in metrics.jsonl. cold_start_s (a fresh process:
# Python, Flower, torch) and setup_time_s (data, model, state) come from deployed nodes, where
# every message starts a process; device_setup_s from a process's first CUDA use.
CLIENT_TIMES = (
    ("train_time_s", "client_train_s"),
    ("eval_time_s", "client_eval_s"),
    ("setup_time_s", "client_setup_s"),
    ("cold_start_s", "client_cold_start_s"),
    ("device_setup_s", "client_device_setup_s"),
)


def client_time_totals(client_metrics: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Seconds the round's clients spent training and evaluating, summed over clients.

    Lets a run show how much of a client's round the ``test_before``/``test_after``
    evaluation costs (the issue's bound: at most 20 %). Absent when clients do not report it.
    """
    out: dict[str, float] = {}
    for key, name in CLIENT_TIMES:
        values = [m[key] for m in client_metrics if key in m]
        if values:
            out[name] = float(sum(values))
    return out


def headline(history: Sequence[Mapping[str, float]], key: str = "test_before_acc", window: int = 10) -> float | None:
    """Mean of ``key`` over the last ``window`` rounds that report it (None if none do)."""
    values = [h[key] for h in history if key in h and h[key] is not None]
    if not values:
        return None
    return float(np.mean(values[-window:]))


def global_test_numbers(history: Sequence[Mapping[str, float]], key: str = "global_acc") -> dict[str, float]:
    """Felo/Velo's reported numbers (Felo/Velo paper, points it leaves open) from the rounds that evaluated the group
    models on the global test set: the last evaluation (``final_global_acc``) and the mean over
    the evaluations in the second half of the run (``global_acc_second_half``, what the paper's
    tables compare). Empty when no round has ``key``."""
    points = [(int(r["round"]), float(r[key])) for r in history if r.get(key) is not None]
    if not points:
        return {}
    last = points[-1][0]
    return {
        "final_global_acc": points[-1][1],
        "global_acc_second_half": float(np.mean([a for r, a in points if r > last / 2])),
    }


def summarize(history: Sequence[Mapping[str, float]], window: int = 10) -> dict[str, float | None]:
    """Headline numbers of a run: last-10 and last-20 means, best round, communication totals."""
    accs = [h.get("test_before_acc") for h in history]
    valid = [a for a in accs if a is not None]
    return {
        "rounds": len(history),
        "headline_test_before_acc": headline(history, "test_before_acc", window),
        "last20_test_before_acc": headline(history, "test_before_acc", 20),
        "headline_test_after_acc": headline(history, "test_after_acc", window),
        "best_test_before_acc": max(valid) if valid else None,
        "best_mean_acc": max(means)
        if (means := [h["mean_client_acc"] for h in history if h.get("mean_client_acc") is not None])
        else None,
        "total_mib_down": sum(h.get("bytes_down", 0) for h in history) / 2**20,
        "total_mib_up": sum(h.get("bytes_up", 0) for h in history) / 2**20,
        "mean_round_time_s": float(np.mean([h["round_time_s"] for h in history])) if history else None,
        "client_eval_share": _eval_share(history),
    }


def _eval_share(history: Sequence[Mapping[str, float]]) -> float | None:
    """Fraction of the clients' round time spent in test_before/test_after evaluation."""
    train = sum(h.get("client_train_s", 0.0) for h in history)
    ev = sum(h.get("client_eval_s", 0.0) for h in history)
    return ev / (train + ev) if train + ev > 0 else None


def per_client_accuracy(client_metrics: Mapping[int, Mapping[str, float]]) -> dict[str, float]:
    """Each client's accuracy on its own test split, keyed by client id (as text, ascending): a
    per-client comparison across runs (which personal layer suits which client) needs it, the
    sample-weighted ``final_acc`` hides it."""
    return {str(cid): m["test_correct"] / m[TEST_SIZE] for cid, m in sorted(client_metrics.items())}


PerArch = Callable[[Callable[[list[Mapping[str, float]]], dict[str, float]]], dict[str, float]]


def final_evaluation(
    client_metrics: Sequence[Mapping[str, float]], per_arch: PerArch, global_test: bool
) -> dict[str, float]:
    """The final evaluation's numbers: accuracy and loss over every client's own test split
    (sample-weighted), each architecture's accuracy (``per_arch(summarize)``: ``<key>@<arch>``,
    empty in a homogeneous run), and with ``global_test`` the mean over the clients' models of
    their accuracy on the whole global test set (``final_global_acc``)."""
    total = sum(m[TEST_SIZE] for m in client_metrics)
    out = {
        "final_acc": sum(m["test_correct"] for m in client_metrics) / total,
        "final_loss": sum(m["test_loss_sum"] for m in client_metrics) / total,
        "final_clients": len(client_metrics),  # a count: printed and saved as an integer
    }
    out.update(per_arch(lambda ms: {"final_acc": sum(m["test_correct"] for m in ms) / sum(m[TEST_SIZE] for m in ms)}))
    if global_test and all(GLOBAL_TEST_SIZE in m for m in client_metrics):

        def mean_global(ms: Sequence[Mapping[str, float]]) -> float:
            return float(np.mean([m["global_correct"] / m[GLOBAL_TEST_SIZE] for m in ms]))

        out["final_global_acc"] = mean_global(client_metrics)
        out.update(per_arch(lambda ms: {"final_global_acc": mean_global(ms)}))
    return out
