"""The run loop of every method: discover, rounds ``last_round()+1 .. num_rounds``, final evaluation.

A plain function over the strategy's public hooks, so the base class stays the list of hooks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO
from typing import Any, Protocol

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from .architectures import Architectures
from .client_directory import ClientInfo
from .hooks import Absorb
from .messaging import TTL_MARGIN_S, late_replies, send_and_receive
from .resume import check_client_state, clients_without_state
from .round_log import format_round, run_elapsed
from .run_context import RunContext


class RoundRunner(Protocol):
    """What the run loop reads and calls on the strategy: Flower's four hooks, discovery, the
    round history and the parts it holds (RunTiming, Architectures)."""

    name: str
    final_eval: bool
    resume_force: bool
    timing: RunTiming
    model: Architectures
    run: RunContext
    clients: Mapping[int, ClientInfo]

    def last_round(self) -> int: ...
    def summary(self) -> None: ...
    def discover(self, grid: Grid, wait_for: int | None = None, timeout: float | None = None) -> None: ...
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Any: ...
    def relay(self, server_round: int) -> Absorb | None: ...
    def relay_train(
        self, server_round: int, grid: Grid, absorb: Absorb, config: ConfigRecord
    ) -> Generator[Message, list[Message], None]: ...
    def aggregate_train(self, server_round: int, replies: Any) -> tuple[ArrayRecord | None, MetricRecord | None]: ...
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Any: ...
    def aggregate_evaluate(self, server_round: int, replies: Any) -> MetricRecord | None: ...
    def configure_final_evaluation(self, server_round: int, grid: Grid) -> Any: ...
    def aggregate_final_evaluation(self, server_round: int, replies: Any) -> MetricRecord | None: ...
    def global_record(self) -> ArrayRecord: ...


RoundCallback = Callable[[dict[str, Any]], None]


@dataclass
class RunTiming:
    """The run loop's own state, a part the strategy holds: how long a batch's replies are waited
    for, a message's time to live, and the seconds of the rounds run before this process (a
    resumed run's clock continues). Set by :meth:`begin` when ``start()`` runs. Not checkpointed:
    the timeout comes from each process's config, the earlier seconds from the round history."""

    round_timeout: float | None = None
    message_ttl: float | None = None
    elapsed_before: float = 0.0

    def begin(self, timeout: float, history: Sequence[Mapping[str, Any]]) -> None:
        self.round_timeout, self.message_ttl = timeout, timeout + TTL_MARGIN_S
        self.elapsed_before = run_elapsed(history)


EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


def relay_round(grid: Grid, messages: Generator[Message, list[Message], None], timeout: float) -> list[Message]:
    """Send a relay round's messages one by one, each after the previous one's replies are in
    (or its timeout passed); returns every reply of the round."""
    replies: list[Message] = []
    try:
        message = next(messages)
        while True:
            got = send_and_receive(grid, [message], timeout)
            replies.extend(got)
            message = messages.send(got)
    except StopIteration:
        return replies


def run_rounds(
    strategy: RoundRunner,
    grid: Grid,
    initial_arrays: ArrayRecord | None,
    num_rounds: int,
    timeout: float,
    evaluate_fn: EvaluateFn | None,
    on_round: RoundCallback | None,
    train_config: Mapping[str, Any] | None = None,
    evaluate_config: Mapping[str, Any] | None = None,
) -> Result:
    """What :meth:`PersonalizedStrategy.start` does (see there)."""
    s = strategy
    first = s.last_round() + 1
    if first > num_rounds + 1:
        raise ValueError(f"the strategy has already run {first - 1} rounds; num_rounds={num_rounds} is fewer")
    if first > 1:
        log(INFO, "Resuming %s after round %d (%d rounds)", s.name, first - 1, num_rounds)
    else:
        log(INFO, "Starting %s (%d rounds)", s.name, num_rounds)
    s.summary()
    s.timing.begin(timeout, s.run.history)
    if initial_arrays is not None and first == 1:
        s.model.set_initial(initial_arrays)
    arrays = s.global_record()  # Flower's loop carries the global model from round to round
    train_config, evaluate_config = ConfigRecord(dict(train_config or {})), ConfigRecord(dict(evaluate_config or {}))
    started = time.perf_counter()
    s.discover(grid)
    lost = []
    if first > 1:
        gone = clients_without_state(s.run.history, s.clients)
        lost = check_client_state(gone, first - 1, s.run.client_spec.get("client_state_dir"), s.resume_force)
    result = Result()
    for rnd in range(first, num_rounds + 1):
        t0 = time.perf_counter()
        absorb = s.relay(rnd)
        if absorb is not None:
            replies = relay_round(grid, s.relay_train(rnd, grid, absorb, train_config), timeout)
        else:
            replies = send_and_receive(grid, s.configure_train(rnd, arrays, train_config, grid), timeout)
        aggregated, metrics = s.aggregate_train(rnd, replies)
        arrays = aggregated if aggregated is not None else arrays
        record = s.run.history[-1]
        late = late_replies(grid).take()  # replies to earlier rounds that came during this one
        if late:
            record["late_replies"] = late
        if lost:
            record["client_state_lost"], lost = lost, []
        if evaluate_fn is not None:
            server = evaluate_fn(rnd, s.global_record())
            if server is not None:
                record.update({f"server_{k}": float(v) for k, v in server.items()})
                result.evaluate_metrics_serverapp[rnd] = server
        evaluation = s.configure_evaluate(rnd, arrays, evaluate_config, grid)  # none at fraction_evaluate=0
        if evaluation:
            evaluated = s.aggregate_evaluate(rnd, send_and_receive(grid, evaluation, timeout))
            if evaluated is not None:
                record.update(dict(evaluated))
                result.evaluate_metrics_clientapp[rnd] = evaluated
        record["round_time_s"] = time.perf_counter() - t0
        record["run_elapsed_s"] = s.timing.elapsed_before + (time.perf_counter() - started)
        result.arrays = aggregated
        if metrics is not None:
            result.train_metrics_clientapp[rnd] = metrics
        log(INFO, "%s", format_round(record, num_rounds))
        if on_round is not None:
            on_round(record)
    if s.final_eval:
        replies = send_and_receive(grid, s.configure_final_evaluation(num_rounds, grid), timeout)
        final = s.aggregate_final_evaluation(num_rounds, replies)
        if final is not None:
            result.evaluate_metrics_clientapp[num_rounds] = final
            log(INFO, "final evaluation over %d clients: acc %.4f", int(final["final_clients"]), final["final_acc"])
    return result
