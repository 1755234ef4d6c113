"""The strategy base every pflower method builds on.

It owns what all personalized methods share: client discovery (stable client ids, not Flower
node ids), seeded sampling, one Message per node with only the tensors that node must receive,
reply validation, byte accounting, the evaluation protocol, checkpoints and the per-round record.
A method declares what it is (:class:`strategies.base.hooks.MethodTraits`) and overrides the few
hooks that say what is different about it (:class:`strategies.base.hooks.MethodHooks`); each is
documented where it is defined and in docs/adding-a-method.md.

The base holds its parts and a method reaches them by name: ``self.options`` (its options),
``self.run`` (:class:`RunContext`: clients, seed, history, the sampling stream, stores),
``self.model`` (:class:`Architectures`: schemas, global arrays, keys) and ``self.clients``
(:class:`Clients`: the connected clients and a batch of a method's own). The rest is the base's
own: :class:`ClientDirectory` (discovery), :class:`RoundLedger` (what a batch sent),
:func:`collect_replies` (validation, client-id order), :mod:`strategies.base.resume` (checkpoint
state, lost client state) and :func:`run_rounds` (the loop).

Determinism: replies are aggregated in client-id order, never in arrival order, so a run's
numbers depend on its seed and config, not on which client answered first.

Checkpoints: a method's server state is what its ``traits.state`` lists; every other attribute is
configuration a fresh strategy rebuilds from the same config. An attribute created after the run
starts and not declared is refused at the first checkpoint; values that cannot be encoded are
refused before round 1.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Generator, Iterable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import nn
from typing_extensions import override

from pflower.models import group_of
from pflower.models.schema import Template
from pflower.protocol import wire
from pflower.protocol.wire import WIRE_EXTRA_PREFIX, TaskSpec

from .architectures import Architectures, check_linear_head
from .checkpoint import CheckpointError
from .client_directory import ClientDirectory
from .client_spec import SetupError, check_client_spec, check_flower_keywords, disagreements_with_spec
from .clients import Clients
from .evaluation import client_time_totals, final_evaluation, per_client_accuracy, weighted_test_metrics
from .hooks import Absorb, MethodHooks, MethodTraits
from .replies import collect_replies as collect_batch
from .resume import check_resumable, restored_history, strategy_state
from .round_ledger import RoundLedger
from .run_context import RunContext
from .run_loop import EvaluateFn, RoundCallback, RunTiming, run_rounds
from .schedule import LRSchedule
from .store import STORE_MODES
from .task_messages import hello_spec, task_message, task_spec
from .validation import ClientUpdate, record_bytes

# every method, by name: a strategy class defined in this package with its own ``name`` joins it
METHODS: dict[str, type[PersonalizedStrategy]] = {}


class PersonalizedStrategy(MethodHooks, Strategy):
    """Base of every pflower method: FedAvg-shaped rounds with per-client messages (what a method
    declares and overrides: :class:`strategies.base.hooks.MethodHooks`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(cls.traits, MethodTraits):
            raise TypeError(f"{cls.__name__}.traits must be a MethodTraits, got {type(cls.traits).__name__}")
        if _passes_everything_on(cls.__init__):  # `help(FedCMD)` and an IDE show the real parameters
            cls.__signature__ = strategy_signature(cls)
        if "name" in cls.__dict__ and cls.__module__.startswith(
            "pflower.strategies."
        ):  # a method registers by subclassing
            known = METHODS.get(cls.name)
            if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
                raise TypeError(f"method name {cls.name!r} is taken by {known.__module__}.{known.__qualname__}")
            METHODS[cls.name] = cls

    def __init__(
        self,
        model: nn.Module | Mapping[str, nn.Module],
        client_spec: Mapping[str, Any],
        *,
        num_clients: int | None = None,
        fraction_train: float = 0.1,
        min_train_nodes: int = 1,
        min_available_nodes: int | None = None,
        min_replies: int = 1,
        seed: int = 42,
        final_eval: bool = True,
        discover_timeout: float = 300.0,
        fraction_evaluate: float = 0.0,
        **options: Any,
    ) -> None:
        """``fraction_train``, ``min_train_nodes`` and ``min_available_nodes`` are Flower's FedAvg
        keywords and mean what they mean there (the share of clients sampled a round, the fewest
        sampled, the nodes to wait for before round 1; default: all ``num_clients``). ``options``:
        the method's (``options_type``), checked here, before round 1; the method reads them as
        ``self.options``. A keyword of Flower's FedAvg that pflower's methods do not take is
        refused in one line saying why (:func:`check_flower_keywords`). ``num_clients``: omitted, as
        Flower's strategies do, it is the number of nodes connected when ``start()`` is called.
        ``fraction_evaluate``: Flower's too, the share of the known clients evaluated after every
        round (:meth:`configure_evaluate`); pflower's default is 0, not Flower's 1, because its
        ``test_before``/``test_after`` protocol already evaluates every client a round trains."""
        check_flower_keywords(options)
        # what start() needs to build the strategy again with what only the run knows (the grid's
        # node count, the run's rounds as total_rounds): see _take_from_start
        self._construction = (
            model,
            client_spec,
            {
                "fraction_train": fraction_train,
                "min_train_nodes": min_train_nodes,
                "min_available_nodes": min_available_nodes,
                "min_replies": min_replies,
                "seed": seed,
                "final_eval": final_eval,
                "discover_timeout": discover_timeout,
                "fraction_evaluate": fraction_evaluate,
            },
            dict(options),
            num_clients is None,
        )
        num_clients = 1 if num_clients is None else num_clients  # checked now, sized at start()
        self.options = self.options_type.build(self.name, _provisional_horizon(self.options_type, options))
        if not 0.0 < fraction_train <= 1.0:
            raise SetupError(f"fraction_train must be in (0, 1], got {fraction_train}")
        if not 0.0 <= fraction_evaluate <= 1.0:
            raise SetupError(f"fraction_evaluate must be in [0, 1], got {fraction_evaluate}")
        self.fraction_evaluate = fraction_evaluate
        check_client_spec(client_spec)
        spec = dict(client_spec)
        lr_schedule = LRSchedule.from_config(spec.pop("lr_schedule", None))
        store = spec.pop("server_store", None) or {}
        store_mode = str(store.get("mode", "memory"))
        if store_mode not in STORE_MODES:
            raise ValueError(f"server_store must be one of {list(STORE_MODES)}, got {store_mode!r}")
        traits = self.traits
        self.model = Architectures(
            model,
            spec,
            num_clients,
            method=self.name,
            heterogeneous=traits.heterogeneous,
            shared_buffers=traits.shared_buffers,
            seed=seed,
        )
        if traits.linear_head:
            check_linear_head(self.name, self.model.schemas)
        spec["model"] = dict(self.model.schema().spec)
        self.run = RunContext(
            self.name,
            num_clients,
            seed,
            fraction_train,
            min_train_nodes,
            spec,
            lr_schedule,
            store_mode,
            store.get("dir"),
        )
        self.min_replies = min_replies
        self.min_available = num_clients if min_available_nodes is None else min_available_nodes
        self.final_eval, self.discover_timeout = final_eval, discover_timeout
        self.directory = ClientDirectory(num_clients, discover_timeout, self.model.take_announced)
        self.final_metrics: dict[str, Any] = {}
        self.ledger = RoundLedger()  # the messages of the batch under way (one reset() per batch)
        self.clients = Clients(self.directory, self)
        self.timing = RunTiming()  # the run loop's part: timeouts, a message's TTL, the earlier rounds' seconds
        # a resumed run goes on although clients lost their state (config resume_force): they are
        # recorded in the round's ``client_state_lost``; without it the resume is refused
        self.resume_force = False
        # the runner sets it (dataset.public=test|holdout with traits.clients_evaluate_on_public):
        # the final evaluation also scores every client's model on the labelled global test set
        self.final_global_test = False
        self._started_with: frozenset[str] | None = None  # the attributes when the run started (start())

    # ------------------------------------------------------------------ the base's own
    @property
    def message_ttl(self) -> float | None:
        """A message's time to live: the round timeout plus a margin (set by ``start()``)."""
        return self.timing.message_ttl

    @property
    def elapsed_before(self) -> float:
        """Seconds of the rounds run before this process's segment (a resumed run's clock)."""
        return self.timing.elapsed_before

    @override
    def summary(self) -> None:
        run = self.run
        log(INFO, "\t├── method: %s (client role %s)", self.name, self.traits.role)
        log(INFO, "\t├── clients: %d, fraction %.2f, seed %d", run.num_clients, run.fraction, run.seed)
        if len(self.model.schemas) > 1:
            counts = self.model.counts()
            log(INFO, "\t├── architectures: %s", ", ".join(f"{a} ({n} clients)" for a, n in counts.items()))
        options = self.options.to_dict()
        if options:
            log(INFO, "\t├── options: %s", ", ".join(f"{k}={v}" for k, v in options.items()))
        log(INFO, "\t└── layer groups: %s", ", ".join(self.model.groups))

    def connected(self, client_ids: Iterable[int], server_round: int) -> list[int]:
        """The sampled clients that are connected now (sorted); the others are logged."""
        chosen = sorted(set(int(c) for c in client_ids))
        available = [c for c in chosen if c in self.clients]
        missing = [c for c in chosen if c not in self.clients]
        if missing:
            log(WARNING, "round %d: sampled clients %s are not connected; training without them", server_round, missing)
        return available

    def train_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        """The local-training arguments of this round (the learning rate from ``lr_schedule``)."""
        train = dict(self.run.client_spec.get("train", {}))
        if "lr" in train and server_round > 0:
            train["lr"] = self.run.lr_schedule.lr(float(train["lr"]), server_round)
        return train

    def task_spec(self, client_id: int, server_round: int, task: str) -> TaskSpec:
        """What one message asks of its client (see :class:`protocol.wire.TaskSpec`)."""
        return task_spec(self, client_id, server_round, task)

    def build_message(
        self,
        client_id: int,
        server_round: int,
        task: str,
        message_type: str,
        down: Mapping[str, np.ndarray],
        extra: Mapping[str, np.ndarray],
        config: Mapping[str, Any] | None = None,
    ) -> Message:
        """The message of ``task`` for ``client_id``: ``down`` (model tensors) and ``extra`` (method
        tensors) with the task spec and ``config`` (Flower's train or evaluate config: keys of the
        message contract win), entered in the round's :class:`RoundLedger`."""
        spec = self.task_spec(client_id, server_round, task)
        message, arrays, groups = task_message(
            spec,
            client_id,
            server_round,
            message_type,
            self.directory.clients[client_id].node_id,
            self.message_ttl,
            down,
            extra,
            self.model.template_of(client_id),
            plain={**(config or {}), **self.plain_config(client_id, server_round, spec)},
        )
        self.ledger.record(client_id, message, record_bytes(arrays), groups)
        return message

    def plain_config(self, client_id: int, server_round: int, spec: TaskSpec) -> dict[str, Any]:
        """The keys a ClientApp of your own reads (docs/api.md, the message contract), beside the
        spec: a train message's learning rate, epochs, batch size and the exact keys its reply
        must carry (where the method allows one set)."""
        if spec.task != "train":
            return {}
        plain: dict[str, Any] = {
            wire.PLAIN_LR: float(spec.train.get("lr", 0.0)),
            wire.PLAIN_EPOCHS: int(spec.train.get("epochs", 1)),
            wire.PLAIN_BATCH_SIZE: int(spec.train.get("batch_size", 32)),
        }
        uploads = self.expected_uploads(client_id, server_round)
        if len(uploads) == 1:
            plain[wire.PLAIN_UPLOAD_KEYS] = list(uploads[0])
        return plain

    # ------------------------------------------------------------------ discovery
    def discover(self, grid: Grid, wait_for: int | None = None, timeout: float | None = None) -> None:
        """Map connected nodes to stable client ids (a restarted SuperNode gets a new node id);
        waits until ``wait_for`` (default ``min_available``) clients are known or ``timeout``
        (default ``discover_timeout``) passes."""
        hello = hello_spec(self.run.client_spec, self.model.schema())
        self.directory.discover(
            grid,
            hello,
            self.min_available if wait_for is None else wait_for,
            self.discover_timeout if timeout is None else timeout,
        )

    # ------------------------------------------------------------------ Flower hooks
    @override
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The round's train messages, one per sampled client. ``config`` (``start()``'s
        ``train_config``) goes into every message's config, as in Flower's FedAvg. ``arrays`` is
        the global model as Flower's loop carries it (``initial_arrays``, then each round's
        aggregate); where pflower differs: each client's arrays are built from the method's state
        (:meth:`downlinks`: its shared groups' global values, a personalized mix, its cluster's
        model), whose global part these arrays are, so they are not read again."""
        ids = self.round_clients(server_round, grid)
        down, extra = self.downlinks(ids, server_round), self.extra_downlinks(ids, server_round)
        # pop: each client's arrays are freed once its message holds them (peak: one round of messages)
        return [
            self.build_message(
                cid, server_round, "train", MessageType.TRAIN, down.pop(cid), extra.pop(cid), dict(config or {})
            )
            for cid in ids
        ]

    def round_clients(self, server_round: int, grid: Grid) -> list[int]:
        """A training round's start: nodes that joined are discovered, the method prepares the
        round, the ledger is emptied, and the sampled clients still connected are returned (a
        batch round and a relay round alike)."""
        self.open_batch(server_round, "train", grid)
        return self.connected(self.sample(server_round), server_round)

    def open_batch(self, server_round: int, task: str, grid: Grid) -> None:
        """Discovery, :meth:`prepare_round`, then an empty ledger that counts what the method's
        own batch (``clients.exchange``) sent."""
        self.discover(grid, wait_for=0, timeout=0)
        self.clients.grid, self.clients.timeout = grid, self.timing.round_timeout
        self.prepare_round(server_round, task)
        self.ledger.reset()
        self.ledger.bytes_down += self.clients.take_bytes_down()  # the method's own batch belongs to this round

    def relay_train(
        self, server_round: int, grid: Grid, absorb: Absorb, config: ConfigRecord | None = None
    ) -> Generator[Message, list[Message], None]:
        """:meth:`configure_train` one client at a time: yields a message, is sent its replies,
        hands each valid reply to ``absorb`` (:meth:`relay`). Every message of the round is in
        the ledger, so :meth:`aggregate_train` collects the round's replies as for a batch."""
        for cid in self.round_clients(server_round, grid):
            down, extra = self.downlinks([cid], server_round), self.extra_downlinks([cid], server_round)
            replies = yield self.build_message(
                cid, server_round, "train", MessageType.TRAIN, down[cid], extra[cid], dict(config or {})
            )
            expected = lambda c: self.expected_uploads(c, server_round)  # noqa: E731
            updates, _ = collect_batch(
                server_round, replies, "train", self.ledger.only(cid), self.directory.clients, expected
            )
            for update in updates:  # an invalid or missing reply: the next client starts where this one did
                absorb(update)

    def expected_uploads(self, client_id: int, server_round: int) -> list[Template]:
        """The key sets (with shapes) a train reply of ``client_id`` may carry (model tensors and extras)."""
        template = self.model.template_of(client_id)
        up = self.uplink(client_id, server_round)
        sets = up.key_sets
        if sets is None:
            sets = [self.travelling_keys(up.groups, client_id, server_round)]
        extra = {WIRE_EXTRA_PREFIX + k: spec for k, spec in up.extra.items()}
        return [{**{k: template[k] for k in keys}, **extra} for keys in sets]

    def collect_replies(
        self, server_round: int, replies: Iterable[Message], task: str
    ) -> tuple[list[ClientUpdate], list[dict]]:
        """The replies to the ledger's batch: valid updates in client-id order (never arrival
        order) and the dropped replies (errors, invalid ones, and clients that never answered)."""
        expected = (lambda cid: self.expected_uploads(cid, server_round)) if task == "train" else (lambda cid: [{}])
        return collect_batch(server_round, replies, task, self.ledger, self.directory.clients, expected)

    @override
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        updates, dropped = self.collect_replies(server_round, replies, "train")
        groups_up = {group_of(k) for u in updates for k in u.arrays}
        record: dict[str, Any] = {
            "round": server_round,
            "clients": [u.client_id for u in updates],
            "dropped": dropped,
            "bytes_down": self.ledger.bytes_down,
            "bytes_up": sum(u.bytes_up for u in updates) + sum(d.get("bytes", 0) for d in dropped),  # all that arrived
            "groups_down": self.model.ordered_groups(self.ledger.groups_down),
            "groups_up": self.model.ordered_groups(groups_up),
        }
        if len(updates) < self.min_replies:
            log(
                WARNING,
                "round %d: %d valid replies < min_replies=%d; model unchanged",
                server_round,
                len(updates),
                self.min_replies,
            )
            record["skipped"] = True
        else:
            record.update(weighted_test_metrics([u.metrics for u in updates]))
            record.update(
                self.per_arch(
                    updates, lambda ms: {k: v for k, v in weighted_test_metrics(ms).items() if k.startswith("test_")}
                )
            )
            record.update(client_time_totals([u.metrics for u in updates]))
            record.update(self.aggregate(server_round, updates))
        self.run.history.append(record)
        scalars = {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return self.global_record(), MetricRecord(scalars)

    def per_arch(self, updates: Sequence[ClientUpdate], summarize) -> dict[str, float]:
        """``summarize`` of each architecture's clients' metrics, as ``<key>@<arch>`` (heterogeneous runs only)."""
        return self.model.per_arch([u.client_id for u in updates], [u.metrics for u in updates], summarize)

    def global_record(self) -> ArrayRecord:
        """The run's global arrays (what Flower's ``Result.arrays`` holds: ``model.global_arch``'s),
        under the model's own state-dict names (``fc3.weight`` for a user's ``Net``)."""
        return ArrayRecord(array_dict={k: Array(v) for k, v in self.model.result_arrays().items()})

    @override
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's evaluation after a round: ``fraction_evaluate`` of the known clients (at least
        one; none at 0, pflower's default), drawn from a stream of its own so the training sample
        stream stays every method's, each evaluating the model it would use now; ``config``
        (``start()``'s ``evaluate_config``) goes into every message. ``arrays`` as in
        :meth:`configure_train`. pflower's own protocol (``test_before``/``test_after`` of every
        trained client, every client after the last round) runs besides it."""
        if self.fraction_evaluate <= 0.0:
            return []
        self.open_batch(server_round, "evaluate", grid)
        known = sorted(self.clients)
        if not known:
            return []
        k = max(1, int(round(self.fraction_evaluate * len(known))))
        draw = np.random.default_rng([int(self.run.seed), int(server_round), 7919])
        ids = sorted(int(c) for c in draw.choice(known, size=min(k, len(known)), replace=False))
        return self.evaluate_messages(server_round, ids, dict(config or {}))

    @override
    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """A round's evaluation replies: their accuracy and loss, sample-weighted (``evaluate_acc``,
        ``evaluate_loss``, ``evaluate_clients``)."""
        updates, _ = self.collect_replies(server_round, replies, "evaluate")
        if not updates:
            return None
        numbers = final_evaluation([u.metrics for u in updates], lambda f: {}, False)
        return MetricRecord({f"evaluate_{k.removeprefix('final_')}": v for k, v in numbers.items()})

    def configure_final_evaluation(self, server_round: int, grid: Grid) -> list[Message]:
        """The final evaluation (pflower's, after the last round): every known client evaluates the
        model it would use now."""
        self.open_batch(server_round, "evaluate", grid)
        return self.evaluate_messages(server_round, sorted(self.clients), {})

    def evaluate_messages(self, server_round: int, ids: Sequence[int], config: Mapping[str, Any]) -> list[Message]:
        """One evaluate message per client of ``ids``: the model it would use now, and ``config``."""
        down, extra = self.downlinks(ids, server_round), self.extra_downlinks(ids, server_round, "evaluate")
        return [
            self.build_message(
                cid, server_round, "evaluate", MessageType.EVALUATE, down.pop(cid), extra.pop(cid, {}), config
            )
            for cid in ids
        ]

    def aggregate_final_evaluation(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The final evaluation's numbers (``final_acc``, per architecture, the global test set's),
        kept for the summary with each client's accuracy."""
        updates, dropped = self.collect_replies(server_round, replies, "evaluate")
        if not updates:
            return None
        metrics = final_evaluation(
            [u.metrics for u in updates], lambda f: self.per_arch(updates, f), self.final_global_test
        )
        per_client = per_client_accuracy({u.client_id: u.metrics for u in updates})
        # in the summary only (the record stays scalar): per-client comparisons across runs
        self.final_metrics = {**metrics, "final_client_acc": per_client, "dropped": dropped}
        return MetricRecord(metrics)

    # ------------------------------------------------------------------ checkpoint/resume
    def last_round(self) -> int:
        """The last round aggregated (0 before the first)."""
        return self.run.last_round()

    def method_state(self) -> dict[str, Any]:
        """The method's server state to checkpoint: the attributes ``traits.state`` declares
        (live references: the checkpoint encodes them at once). An attribute created after the
        run started that is neither declared nor private (``_name``) is refused, naming it."""
        if self._started_with is not None:
            undeclared = sorted(
                k for k in set(vars(self)) - self._started_with if not k.startswith("_") and k not in self.traits.state
            )
            if undeclared:
                raise CheckpointError(
                    f"{type(self).__name__} set {undeclared} after the run started; resume would lose them: list "
                    "them in traits.state (saved and restored), or name them with a leading _ (per-round scratch)"
                )
        missing = [k for k in self.traits.state if not hasattr(self, k)]
        if missing:
            raise CheckpointError(
                f"{type(self).__name__}.traits.state names {missing}, which the strategy does not have: create "
                "them in __init__"
            )
        return {k: getattr(self, k) for k in self.traits.state}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run after :meth:`last_round` (:mod:`strategies.base.resume`)."""
        return strategy_state(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (a :meth:`state_dict`, e.g. decoded from a checkpoint).

        The strategy must be built from the same config and run token; the arrays must fit
        the models. Clients are not restored: they are discovered again (new node ids).
        Each part restores what it owns: the model its arrays, the run its history and
        sampling stream, the method the attributes its ``traits.state`` declares.
        """
        check_resumable(self, state)
        self.model.restore(state)
        self.run.history = restored_history(state)
        self.run.rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
        saved = dict(state["extra"])
        declared = set(self.traits.state)
        if set(saved) != declared:
            raise CheckpointError(
                f"the checkpoint holds {type(self).__name__} state {sorted(saved)}, this version declares "
                f"{sorted(declared)}: resume it with the pflower version that wrote it"
            )
        for key, value in saved.items():
            setattr(self, key, value)

    # ------------------------------------------------------------------ the run loop
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
        on_round: RoundCallback | None = None,
    ) -> Result:
        """Discover clients, run rounds ``last_round()+1 .. num_rounds``, then the final evaluation.

        A fresh strategy starts at round 1; one restored with :meth:`load_state_dict` goes on
        after its last round. ``evaluate_fn(round, arrays)`` (Flower's server-side evaluation)
        is called after each round with the default architecture's global arrays; its metrics
        join the round's record with a ``server_`` prefix. ``train_config`` and ``evaluate_config``
        go into every train and evaluate message's config (Flower's meaning; a training setting
        ``client_spec`` holds must agree with it). With ``fraction_evaluate`` > 0, every round
        ends with :meth:`configure_evaluate` / :meth:`aggregate_evaluate` (``evaluate_*`` keys in the
        round's record). ``on_round`` receives each round's
        record as soon as it is aggregated, with the strategy's state complete for that round
        (the runner appends the record to metrics.jsonl, then writes the checkpoint, before the
        next round starts).
        """
        self._take_from_start(grid, num_rounds)
        self._started_with = frozenset(vars(self))
        # as Flower's FedAvg does, every train (evaluate) message carries train_config (evaluate_config);
        # a training setting of client_spec it names must agree with it: pflower's clients train from the spec
        clashing = disagreements_with_spec(dict(train_config or {}), self.run.client_spec["train"])
        if clashing:
            raise ValueError(
                f"train_config sets {clashing}, which client_spec sets otherwise: pflower's clients train from "
                "client_spec (pflower.strategies.client_spec(lr=..., local_epochs=..., batch_size=...)); set them there"
            )
        return run_rounds(
            self, grid, initial_arrays, num_rounds, timeout, evaluate_fn, on_round, train_config, evaluate_config
        )

    def _take_from_start(self, grid: Grid, num_rounds: int) -> None:
        """Build the strategy again, before its first round, with what only ``start()`` knows and
        the constructor was not told: ``num_clients`` (the nodes connected now, as Flower's
        strategies count them) and a method's ``total_rounds`` (the run's ``num_rounds``: Felo's
        warm-up and last evaluation, FedCMD's ``rho``, pFedSim's and FedAP's warm-up shares are
        planned on it). Without it, ``Felo(...).start(num_rounds=3)`` planned on the option's
        default of 100 rounds and spent all 3 in its warm-up."""
        model, spec, base, options, count_nodes = self._construction
        if self.run.last_round() > 0:  # resumed: the run's own sizes stand
            return
        changes: dict[str, Any] = {}
        if count_nodes:
            changes["num_clients"] = connected_nodes(grid, self.discover_timeout)
        horizon = "total_rounds" in {f.name for f in dataclasses.fields(self.options_type)}
        if horizon and "total_rounds" not in options and getattr(self.options, "total_rounds") != num_rounds:
            changes["total_rounds"] = num_rounds
        if not changes:
            return
        set_after = {k: v for k, v in vars(self).items() if k in ("resume_force", "final_global_test")}
        set_after.update({k: v for k, v in vars(self).items() if k.startswith("public") and v is not None})
        num_clients = changes.pop("num_clients", None if count_nodes else self.run.num_clients)
        type(self).__init__(self, model, spec, num_clients=num_clients, **base, **options, **changes)
        vars(self).update(set_after)
        log(
            INFO,
            "%s: %s, from start()",
            self.name,
            ", ".join(
                [f"num_clients={self.run.num_clients} (the connected nodes)"] * count_nodes
                + [f"total_rounds={num_rounds} (num_rounds)"] * ("total_rounds" in changes)
            ),
        )


# what a method's total_rounds stands at between the constructor and start() where the caller gave
# none and the option has no default (pFedSim's and FedAP's warm-up shares, FedCMD's rho): far beyond
# any run, so nothing derived from it ends before start() replaces it with num_rounds
PROVISIONAL_ROUNDS = 10**6


def _provisional_horizon(options_type: type, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with :data:`PROVISIONAL_ROUNDS` as ``total_rounds`` where the method has that
    option without a default and the caller did not give it (:meth:`PersonalizedStrategy._take_from_start`
    sets the run's own before round 1)."""
    fields = {f.name: f for f in dataclasses.fields(options_type)}
    horizon = fields.get("total_rounds")
    if horizon is None or "total_rounds" in options or horizon.default is not None:
        return dict(options)
    return {**options, "total_rounds": PROVISIONAL_ROUNDS}


def connected_nodes(grid: Grid, timeout: float, settle_s: float = 2.0) -> int:
    """The nodes connected to ``grid``: their count once it holds still for ``settle_s`` seconds
    (SuperNodes of a deployment connect one after another), at most ``timeout`` seconds after the
    first; a grid with no node by then is a :class:`FederationError`."""
    deadline = time.monotonic() + timeout
    count, steady_since = len(list(grid.get_node_ids())), time.monotonic()
    while time.monotonic() < deadline:
        if count and time.monotonic() - steady_since >= settle_s:
            return count
        time.sleep(0.5)
        now = len(list(grid.get_node_ids()))
        if now != count:
            count, steady_since = now, time.monotonic()
    if not count:
        from .client_directory import FederationError

        raise FederationError(
            f"num_clients was not given and no node connected within {timeout:g} s: start the SuperNodes, or pass "
            "num_clients= to the strategy"
        )
    return count


def _passes_everything_on(init: Any) -> bool:
    """Whether ``init`` is ``(self, *args, **kwargs)`` (a method's ``__init__`` that hands its
    arguments to the base) or the base's own."""
    params = list(inspect.signature(init).parameters.values())[1:]
    kinds = [p.kind for p in params]
    return kinds == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD] or (
        init is PersonalizedStrategy.__init__
    )


def strategy_signature(cls: type[PersonalizedStrategy]) -> inspect.Signature:
    """The constructor's signature as a caller sees it: the base's parameters, then the method's
    options (:class:`MethodOptions` fields) as keyword-only ones with their defaults and types."""
    base = [
        p
        for name, p in inspect.signature(PersonalizedStrategy.__init__).parameters.items()
        if name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    options = []
    for f in dataclasses.fields(cls.options_type):
        if f.name not in cls.options_type.names():  # a value the strategy sends its role, no option
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        options.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=f.type))
    return inspect.Signature(base + options, return_annotation=None)
