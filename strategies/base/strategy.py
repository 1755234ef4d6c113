"""The strategy base every pflower method builds on.

It owns what all personalized methods share: client discovery (stable client ids, not Flower
node ids), seeded sampling, one Message per node with only the tensors that node must receive,
reply validation, byte accounting, the evaluation protocol, checkpoints and the per-round record.
A method overrides the few hooks below that say what is different about it; each is documented
where it is defined and in docs/adding-a-method.md.

The base holds its parts and reaches them through public names: :class:`Architectures`
(schemas, global arrays, who runs which model), :class:`ClientDirectory` (discovery),
:class:`RoundLedger` (what a batch sent: messages, bytes, groups), :func:`collect_replies`
(validation, client-id order), :mod:`strategies.base.resume` (checkpoint state, lost client state)
and :func:`run_rounds` (the loop).

Determinism: replies are aggregated in client-id order, never in arrival order, so a run's
numbers depend on its seed and config, not on which client answered first.

Checkpoints: a method's server state is *every instance attribute the base does not own* (the
base's are those its ``__init__`` sets, found when it runs, not listed by hand), so per-client
stores, similarity matrices, clusters, dataclasses, torch modules and NumPy generators created
in ``__init__`` are saved and restored with no code in the method. ``checkpoint_exclude`` names
attributes a fresh strategy rebuilds from the config; :meth:`extra_state` /
:meth:`load_extra_state` may be overridden (call ``super()``) for lazily created objects.
Values that cannot be encoded are refused before round 1.
"""

from __future__ import annotations

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
from pflower.models.schema import ModelSchema, Template
from pflower.protocol import wire
from pflower.protocol.wire import WIRE_EXTRA_PREFIX, TaskSpec

from .architectures import Architectures, check_linear_head
from .client_directory import ClientDirectory, ClientInfo
from .client_spec import SetupError, agrees_with_spec, check_client_spec, check_flower_keywords
from .evaluation import client_time_totals, final_evaluation, per_client_accuracy, weighted_test_metrics
from .hooks import MethodHooks
from .replies import collect_replies as collect_batch
from .resume import check_resumable, restored_history, strategy_state
from .round_ledger import RoundLedger
from .run_loop import EvaluateFn, RoundCallback, RunTiming, run_rounds
from .schedule import LRSchedule
from .store import STORE_MODES, ClientStore, open_store
from .task_messages import hello_spec, task_message, task_spec
from .validation import ClientUpdate, record_bytes

# every method, by name: a strategy class defined in this package with its own ``name`` joins it
METHODS: dict[str, type[PersonalizedStrategy]] = {}

# hooks that moved: a subclass defining one of these would be silently ignored
_RETIRED_HOOKS = {
    "downlink": "downlinks(client_ids, server_round) (a whole round at once)",
    "extra_downlink": "extra_downlinks(client_ids, server_round) (a whole round at once)",
}


class PersonalizedStrategy(MethodHooks, Strategy):
    """Base of every pflower method: FedAvg-shaped rounds with per-client messages (the hooks a
    method overrides and their defaults are :class:`strategies.base.hooks.MethodHooks`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for hook, instead in _RETIRED_HOOKS.items():
            if hook in cls.__dict__:
                raise TypeError(f"{cls.__name__} defines {hook}(); override {instead} instead")
        if cls.client_keeps not in wire.KEEP_MODES:
            raise TypeError(f"{cls.__name__}.client_keeps must be one of {list(wire.KEEP_MODES)}")
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
        num_clients: int,
        fraction_train: float = 0.1,
        min_train_nodes: int = 1,
        min_available_nodes: int | None = None,
        min_replies: int = 1,
        seed: int = 42,
        final_eval: bool = True,
        discover_timeout: float = 300.0,
        **options: Any,
    ) -> None:
        """``fraction_train``, ``min_train_nodes`` and ``min_available_nodes`` are Flower's FedAvg
        keywords and mean what they mean there (the share of clients sampled a round, the fewest
        sampled, the nodes to wait for before round 1; default: all ``num_clients``). ``options``:
        the method's (``options_type``), checked here, before round 1; the method reads them as
        ``self.options``. A keyword of Flower's FedAvg that pflower's methods do not take is
        refused in one line saying why (:func:`check_flower_keywords`)."""
        before = set(vars(self))  # a subclass may set attributes before calling this: those are its own
        check_flower_keywords(options)
        self.options = self.options_type.build(self.name, options)
        fraction, min_clients, min_available = fraction_train, min_train_nodes, min_available_nodes
        if not 0.0 < fraction <= 1.0:
            raise SetupError(f"fraction_train must be in (0, 1], got {fraction}")
        check_client_spec(client_spec)
        spec = dict(client_spec)
        self.lr_schedule = LRSchedule.from_config(spec.pop("lr_schedule", None))
        store = spec.pop("server_store", None) or {}
        self.store_mode, self.store_dir = str(store.get("mode", "memory")), store.get("dir")
        if self.store_mode not in STORE_MODES:
            raise ValueError(f"server_store must be one of {list(STORE_MODES)}, got {self.store_mode!r}")
        self.architectures = Architectures(
            model,
            spec,
            num_clients,
            method=self.name,
            heterogeneous=self.heterogeneous,
            shared_buffers=self.shared_buffers,
            seed=seed,
        )
        if self.linear_head:
            check_linear_head(self.name, self.architectures.schemas)
        spec["model"] = dict(self.schema().spec)
        self.client_spec = spec
        self.num_clients, self.fraction, self.seed = num_clients, fraction, seed
        self.min_clients, self.min_replies = min_clients, min_replies
        self.min_available = num_clients if min_available is None else min_available
        self.final_eval, self.discover_timeout = final_eval, discover_timeout
        self.rng = np.random.default_rng(seed)
        self.directory = ClientDirectory(num_clients, discover_timeout, self.architectures.take_announced)
        self.history: list[dict[str, Any]] = []
        self.final_metrics: dict[str, Any] = {}
        self.ledger = RoundLedger()  # the messages of the batch under way (one reset() per batch)
        self.timing = RunTiming()  # the run loop's part: timeouts, a message's TTL, the earlier rounds' seconds
        # a resumed run goes on although clients lost their state (config resume_force): they are
        # recorded in the round's ``client_state_lost``; without it the resume is refused
        self.resume_force = False
        # what the base owns: saved explicitly by state_dict() or deliberately not at all (config-derived,
        # or per-connection like the directory: node ids change when a SuperNode restarts)
        self.base_attributes = frozenset(set(vars(self)) - before) | {"base_attributes"}

    # ------------------------------------------------------------------ architectures
    @property
    def schemas(self) -> dict[str, ModelSchema]:
        return self.architectures.schemas

    @property
    def default_arch(self) -> str:
        return self.architectures.default

    @property
    def arch_of(self) -> dict[int, str]:
        """Client id -> its architecture."""
        return self.architectures.arch_of

    @property
    def round_timeout(self) -> float | None:
        """The wait for a batch's replies (set by ``start()``; a method's own batch waits as long)."""
        return self.timing.round_timeout

    @property
    def message_ttl(self) -> float | None:
        """A message's time to live: the round timeout plus a margin (set by ``start()``)."""
        return self.timing.message_ttl

    @property
    def elapsed_before(self) -> float:
        """Seconds of the rounds run before this process's segment (a resumed run's clock)."""
        return self.timing.elapsed_before

    @property
    def arch_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """Each architecture's global arrays."""
        return self.architectures.arrays

    def schema(self, client_id: int | None = None) -> ModelSchema:
        """The model schema of ``client_id`` (the default architecture's if None)."""
        return self.architectures.schema(client_id)

    def arrays_of(self, client_id: int) -> dict[str, np.ndarray]:
        """The global arrays of ``client_id``'s architecture."""
        return self.arch_arrays[self.arch_of[client_id]]

    def client_store(self, name: str, bytes_per_client: int = 0) -> ClientStore:
        """A per-client array store for the method's server state (stored bodies, models): in memory
        or on disk as config ``server_store`` says (:func:`strategies.base.store.open_store`)."""
        return open_store(self.store_mode, self.store_dir, self.name, name, bytes_per_client * self.num_clients)

    @property
    def global_arrays(self) -> dict[str, np.ndarray]:
        """The global model of a homogeneous run (every travelling tensor, by key)."""
        return self.arch_arrays[self.architectures.single(type(self).__name__)]

    @global_arrays.setter
    def global_arrays(self, value: dict[str, np.ndarray]) -> None:
        self.arch_arrays[self.architectures.single(type(self).__name__)] = value

    @property
    def groups(self) -> list[str]:
        """Layer groups of the default architecture, in forward order."""
        return list(self.schema().groups)

    @property
    def group_keys(self) -> dict[str, list[str]]:
        return {g: list(k) for g, k in self.schema().group_keys.items()}

    @property
    def template(self) -> Template:
        """Shape and dtype of every tensor of the default architecture that may travel."""
        return self.template_of(None)

    def template_of(self, client_id: int | None) -> Template:
        return self.architectures.template_of(client_id)

    # ------------------------------------------------------------------ helpers
    def keys(self, groups: Iterable[str] | None = None, client_id: int | None = None) -> list[str]:
        """Keys of ``groups`` that belong to the model on the wire (trainable tensors, and float
        buffers with ``shared_buffers``), in forward order, in ``client_id``'s architecture."""
        return self.schema(client_id).keys(groups, buffers=self.shared_buffers)

    @override
    def summary(self) -> None:
        log(INFO, "\t├── method: %s (client role %s)", self.name, self.role)
        log(INFO, "\t├── clients: %d, fraction %.2f, seed %d", self.num_clients, self.fraction, self.seed)
        if len(self.schemas) > 1:
            counts = self.architectures.counts()
            log(INFO, "\t├── architectures: %s", ", ".join(f"{a} ({n} clients)" for a, n in counts.items()))
        log(INFO, "\t└── layer groups: %s", ", ".join(self.groups))

    def sample_size(self) -> int:
        return max(self.min_clients, int(self.fraction * self.num_clients))

    def draw(self, population: Sequence[int], k: int) -> list[int]:
        """``k`` distinct client ids from ``population``, uniformly, from the run's seeded stream (sorted)."""
        pool = np.asarray(list(population), dtype=np.int64)
        if len(pool) == 0 or k <= 0:
            return []
        return sorted(int(c) for c in self.rng.choice(pool, size=min(k, len(pool)), replace=False))

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
        train = dict(self.client_spec.get("train", {}))
        if "lr" in train and server_round > 0:
            train["lr"] = self.lr_schedule.lr(float(train["lr"]), server_round)
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
    ) -> Message:
        """The message of ``task`` for ``client_id``: ``down`` (model tensors) and ``extra`` (method
        tensors) with the task spec, entered in the round's :class:`RoundLedger`. A method that
        sends a batch of its own (FedCPMD's probes) resets the ledger, builds its messages with
        this, and reads the replies with :meth:`collect_replies`."""
        spec = self.task_spec(client_id, server_round, task)
        message, arrays, groups = task_message(
            spec,
            client_id,
            server_round,
            message_type,
            self.clients[client_id].node_id,
            self.message_ttl,
            down,
            extra,
            self.template_of(client_id),
            plain=self.plain_config(client_id, server_round, spec),
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
    @property
    def clients(self) -> dict[int, ClientInfo]:
        """The connected clients by client id (the directory's; kept current by :meth:`discover`)."""
        return self.directory.clients

    def discover(self, grid: Grid, wait_for: int | None = None, timeout: float | None = None) -> None:
        """Map connected nodes to stable client ids (a restarted SuperNode gets a new node id);
        waits until ``wait_for`` (default ``min_available``) clients are known or ``timeout``
        (default ``discover_timeout``) passes."""
        hello = hello_spec(self.client_spec, self.schema())
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
        ids = self.round_clients(server_round, grid)
        down, extra = self.downlinks(ids, server_round), self.extra_downlinks(ids, server_round)
        # pop: each client's arrays are freed once its message holds them (peak: one round of messages)
        return [
            self.build_message(cid, server_round, "train", MessageType.TRAIN, down.pop(cid), extra.pop(cid))
            for cid in ids
        ]

    def round_clients(self, server_round: int, grid: Grid) -> list[int]:
        """A training round's start: nodes that joined are discovered, the ledger is emptied, and
        the sampled clients still connected are returned (a batch round and a relay round alike)."""
        self.discover(grid, wait_for=0, timeout=0)
        self.ledger.reset()
        return self.connected(self.sample(server_round), server_round)

    def relay(self, server_round: int) -> bool:
        """Whether this round trains its clients one after another, each message built after the
        previous client's reply (:meth:`absorb_relay`). Default no: one batch of messages."""
        return False

    def absorb_relay(self, server_round: int, update: ClientUpdate) -> None:
        """A relay round's valid reply, before the next client's message is built (default: nothing)."""

    def relay_train(self, server_round: int, grid: Grid) -> Generator[Message, list[Message], None]:
        """:meth:`configure_train` one client at a time: yields a message, is sent its replies.
        Every message of the round is in the ledger, so :meth:`aggregate_train` collects the
        round's replies as for a batch."""
        for cid in self.round_clients(server_round, grid):
            down, extra = self.downlinks([cid], server_round), self.extra_downlinks([cid], server_round)
            replies = yield self.build_message(cid, server_round, "train", MessageType.TRAIN, down[cid], extra[cid])
            expected = lambda c: self.expected_uploads(c, server_round)  # noqa: E731
            updates, _ = collect_batch(server_round, replies, "train", self.ledger.only(cid), self.clients, expected)
            for update in updates:  # an invalid or missing reply: the next client starts where this one did
                self.absorb_relay(server_round, update)

    def expected_uploads(self, client_id: int, server_round: int) -> list[Template]:
        """The key sets (with shapes) a train reply of ``client_id`` may carry (model tensors and extras)."""
        template = self.template_of(client_id)
        sets = self.uplink_sets(client_id, server_round)
        if sets is None:
            sets = [self.travelling_keys(self.uplink_groups(client_id, server_round), client_id, server_round)]
        extra = {WIRE_EXTRA_PREFIX + k: spec for k, spec in self.extra_uplink(client_id, server_round).items()}
        return [{**{k: template[k] for k in keys}, **extra} for keys in sets]

    def collect_replies(
        self, server_round: int, replies: Iterable[Message], task: str
    ) -> tuple[list[ClientUpdate], list[dict]]:
        """The replies to the ledger's batch: valid updates in client-id order (never arrival
        order) and the dropped replies (errors, invalid ones, and clients that never answered)."""
        expected = (lambda cid: self.expected_uploads(cid, server_round)) if task == "train" else (lambda cid: [{}])
        return collect_batch(server_round, replies, task, self.ledger, self.clients, expected)

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
            "groups_down": self.architectures.ordered_groups(self.ledger.groups_down),
            "groups_up": self.architectures.ordered_groups(groups_up),
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
        self.history.append(record)
        scalars = {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return self.global_record(), MetricRecord(scalars)

    def per_arch(self, updates: Sequence[ClientUpdate], summarize) -> dict[str, float]:
        """``summarize`` of each architecture's clients' metrics, as ``<key>@<arch>`` (heterogeneous runs only)."""
        return self.architectures.per_arch([u.client_id for u in updates], [u.metrics for u in updates], summarize)

    def global_record(self) -> ArrayRecord:
        """The default architecture's global arrays (what Flower's ``Result.arrays`` holds), under
        the model's own state-dict names (``fc3.weight`` for a user's ``Net``), as Flower gives them."""
        arrays = self.architectures.own_names(self.arch_arrays[self.default_arch])
        return ArrayRecord(array_dict={k: Array(v) for k, v in arrays.items()})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Final evaluation: every known client evaluates the model it would use now."""
        self.discover(grid, wait_for=0, timeout=0)
        self.ledger.reset()
        ids = sorted(self.clients)
        down, extra = self.downlinks(ids, server_round), self.evaluate_extras(ids, server_round)
        return [
            self.build_message(cid, server_round, "evaluate", MessageType.EVALUATE, down.pop(cid), extra.pop(cid, {}))
            for cid in ids
        ]

    @override
    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
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
        return int(self.history[-1]["round"]) if self.history else 0

    def extra_state(self) -> dict[str, Any]:
        """The method's server state to checkpoint: by default every instance attribute that
        the base does not own and ``checkpoint_exclude`` does not list (live references)."""
        skip = self.base_attributes | set(self.checkpoint_exclude)
        return {k: v for k, v in vars(self).items() if k not in skip}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`extra_state`: by default set each saved attribute."""
        for key, value in state.items():
            setattr(self, key, value)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run after :meth:`last_round` (:mod:`strategies.base.resume`)."""
        return strategy_state(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (a :meth:`state_dict`, e.g. decoded from a checkpoint).

        The strategy must be built from the same config and run token; the arrays must fit
        the models. Clients are not restored: they are discovered again (new node ids).
        Each part restores what it owns: the architectures their arrays, the method its extra state.
        """
        check_resumable(self, state)
        self.architectures.restore(state)
        self.history = restored_history(state)
        self.rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
        self.load_extra_state(state["extra"])

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
        join the round's record with a ``server_`` prefix. ``on_round`` receives each round's
        record as soon as it is aggregated, with the strategy's state complete for that round
        (the runner appends the record to metrics.jsonl, then writes the checkpoint, before the
        next round starts).
        """
        for name, record in (("train_config", train_config), ("evaluate_config", evaluate_config)):
            # Flower's strategies send it to every client; pflower's spec already says it all, so
            # only a train_config that repeats client_spec (Flower's quickstart passes its lr) is taken
            if record and (name == "evaluate_config" or not agrees_with_spec(record, self.client_spec["train"])):
                raise ValueError(
                    f"{name}={dict(record)!r}: pflower's strategies configure the clients' training from "
                    "client_spec (pflower.strategies.client_spec(lr=..., local_epochs=..., batch_size=...)) and "
                    f"from the method's options, and send no {name}: move these settings there"
                )
        return run_rounds(self, grid, initial_arrays, num_rounds, timeout, evaluate_fn, on_round)
