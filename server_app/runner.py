"""One experiment on a Grid: validate, build model + strategy, run, write results, print the summary.

With ``resume=<run dir>`` the run directory's checkpoint is restored into a strategy built from
its config.yaml and the run goes on after the checkpointed round, in the same directory.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.common import log
from flwr.serverapp import Grid

from pflower.federated_data import data_origin, load_public_data, partition_sizes
from pflower.federated_data.partition import PartitionError
from pflower.models import LayeredNet, build_model
from pflower.strategies import PersonalizedStrategy, build_strategy
from pflower.strategies.base.checkpoint import Checkpoint, CheckpointError, encode, load_checkpoint, save_checkpoint
from pflower.strategies.base.evaluation import summarize
from pflower.strategies.base.replies import ClientsFailed
from pflower.strategies.base.round_log import format_value

from .config import ConfigError, differs_from_saved
from .failures import discard_unstarted_run
from .interrupt import RunInterrupted, checkpointed_round
from .progress import RunProgress, Sweep
from .provenance import write_provenance
from .results import RunWriter, atomic_write, jsonable, make_run_dir
from .run_plan import RunPlan


def check_data(plan: RunPlan) -> list[int]:
    """Build the partition once on the server (simulation shares the data): fail before round 1."""
    try:
        return partition_sizes(plan.data)
    except (PartitionError, FileNotFoundError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc


def client_state_dir(value: str | None, run_dir: Path | None) -> str | None:
    """``client_state_dir=auto``: ``<run dir>/client_state`` (so a resumed simulation finds it)."""
    if value in (None, "", "null"):
        return None
    if value == "auto":
        if run_dir is None:
            return None
        return str(run_dir / "client_state")
    return str(Path(str(value)).expanduser().resolve())


def build_models(plan: RunPlan) -> LayeredNet | dict[str, LayeredNet]:
    """The run's initial model (seeded), or one per architecture of a mixed federation."""
    info, seed = plan.data.info, plan.run.seed
    models = {
        arch: build_model(
            spec["name"], info.in_shape, info.num_classes, seed=seed, **{k: v for k, v in spec.items() if k != "name"}
        )
        for arch, spec in plan.archs.items()
    }
    return models if plan.mixed else next(iter(models.values()))


def build(plan: RunPlan, run_token: str, run_dir: Path | None = None) -> PersonalizedStrategy:
    """The run's strategy, its models built and its public data attached (``run_dir``: where its
    client state and server store go; None for a check that runs nothing)."""
    run = plan.run
    spec = plan.client_spec(
        run_token,
        client_state_dir(run.client_state_dir, run_dir),
        None if run_dir is None else str(run_dir / "server_store"),
    )
    strategy = build_strategy(
        plan.method,
        build_models(plan),
        spec,
        method_args=plan.options,
        num_clients=run.num_clients,
        fraction_train=run.fraction,
        min_train_nodes=run.min_clients,
        min_replies=run.min_replies,
        seed=run.seed,
        final_eval=run.final_eval,
    )
    strategy.resume_force = run.resume_force
    traits = strategy.traits
    if traits.needs_public_data:
        strategy.attach_public(public_images(plan))
    elif plan.data.public != "none":
        if not plan.data.info.node_local and traits.evaluates_on_public:
            strategy.attach_public(*load_public_data(plan.data))
        if not plan.data.info.node_local and traits.clients_evaluate_on_public:
            strategy.final_global_test = True  # each client scores its own model on the global test set at the end
    return strategy


def public_images(plan: RunPlan) -> Any:
    """The server's public unlabelled images (FedTSDP): the ``dataset.public`` split, labels dropped."""
    if plan.data.public == "none" or plan.data.info.node_local:
        raise ConfigError(
            f"method {plan.method!r} needs public unlabelled data on the server: set dataset.public=holdout "
            "(a held-out share of the pooled data, dataset.public_fraction) or dataset.public=test (the official "
            "test split), with a dataset the server can read (not dataset=local)"
        )
    return load_public_data(plan.data)[0]


def check_strategy(plan: RunPlan) -> None:
    """Build a strategy for ``plan`` and drop it: the pre-check of many runs at once (a sweep, the
    leaderboard's plan), before any of them starts. A single run is checked by :func:`prepare_run`,
    which builds its strategy once and keeps it."""
    try:
        build(plan, run_token="check")
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


@dataclass
class PreparedRun:
    """A run made ready once, before any round and before an engine starts: its config resolved
    (``plan``), its directory and token, the checkpoint it continues, and its strategy, built once.
    ``discard()`` removes the directory of a new run that never started."""

    plan: RunPlan
    run_dir: Path
    run_token: str
    checkpoint: Checkpoint | None
    strategy: PersonalizedStrategy
    made_root: bool = False  # the output folder did not exist before this run made it

    def discard(self, before_start: bool = False) -> None:
        """``before_start``: the run was stopped before it began (its engine did not start): no
        line of its own, and the folders it made go too. A run already written says what it removed."""
        if self.checkpoint is None:
            began = (self.run_dir / "config.yaml").exists()
            quiet = before_start and not began
            discard_unstarted_run(self.run_dir, made_root=self.made_root and quiet, quiet=quiet)


def prepare_run(plan: RunPlan, check_partition: bool = True) -> PreparedRun:
    """Check the checkpoint ``plan`` resumes and its data partition, make its run directory and
    build its strategy: a method option that cannot work (FedCMD's ``kp >= rounds``...) is one line
    (ConfigError) and leaves no run directory behind."""
    checkpoint = resumable(plan) if plan.run.resume else None
    if check_partition:
        check_data(plan)
    made_root = not Path(plan.run.output_dir).expanduser().exists()
    if checkpoint is None:
        run_dir = make_run_dir(plan.run.output_dir, plan.method, plan.run.dataset)
        run_token = f"{run_dir.name}-{uuid.uuid4().hex[:8]}"
    else:
        run_dir, run_token = checkpoint.path.parent, checkpoint.run_token
    try:
        strategy = build(plan, run_token, run_dir)
    except BaseException as exc:
        if checkpoint is None:  # refused before it began: nothing of it is left, not even the folders it made
            discard_unstarted_run(run_dir, made_root=made_root, quiet=True)
        if isinstance(exc, ValueError) and not isinstance(exc, ConfigError):
            raise ConfigError(str(exc)) from exc
        raise
    return PreparedRun(plan, run_dir, run_token, checkpoint, strategy, made_root)


def run_experiment(
    grid: Grid, run: RunPlan | PreparedRun, check_partition: bool = True, sweep: Sweep | None = None
) -> dict[str, Any]:
    """Run the plan ``run`` (or a run :func:`prepare_run` made ready) on ``grid``; returns the
    summary (also written to the run directory).

    ``sweep``: the run's place in a ``pflower sim -m`` sweep, for the progress lines.
    """
    prepared = run if isinstance(run, PreparedRun) else prepare_run(run, check_partition)
    try:
        return _run_in(prepared, grid, sweep)
    except KeyboardInterrupt as exc:  # Ctrl-C: the checkpoint stays; the command says how to go on
        prepared.discard()
        if isinstance(exc, RunInterrupted):
            raise
        kept = prepared.run_dir if prepared.run_dir.is_dir() else None
        raise RunInterrupted(kept, checkpointed_round(kept) if kept else None) from None
    except ClientsFailed as exc:  # pflower's own run has a checkpoint to go on from; a library user's strategy not
        prepared.discard()
        done = checkpointed_round(prepared.run_dir) if prepared.run_dir.is_dir() else None
        if done is None:
            raise
        raise ClientsFailed(
            f"{exc}; the run continues from its checkpoint of round {done} with resume={prepared.run_dir}"
        ) from exc
    except BaseException:
        prepared.discard()
        raise


def _run_in(prepared: PreparedRun, grid: Grid, sweep: Sweep | None) -> dict[str, Any]:
    plan, run_dir, checkpoint, strategy = prepared.plan, prepared.run_dir, prepared.checkpoint, prepared.strategy
    run = plan.run
    writer = RunWriter(run_dir)
    origin = data_origin(plan.data)
    if origin:
        log(
            INFO,
            "pflower data: %s read from %s (sha256 %s)",
            run.dataset,
            origin["data_dir"],
            origin["data_sha256"][:16],
        )
    if checkpoint is None:
        writer.write_config(plan.record)
        write_provenance(run_dir, grid, data=origin)
        log(INFO, "pflower run directory: %s", run_dir)  # absolute: see also the summary's run_dir
    else:
        try:
            strategy.load_state_dict(checkpoint.decode(strategy.state_dict()))
        except ValueError as exc:
            raise CheckpointError(f"cannot resume from {checkpoint.path}: {exc}") from exc
        writer.rounds = restore_metrics(run_dir, strategy.run.history)
        atomic_write(run_dir / "config.yaml", plan.record)  # the new rounds, if raised
        write_provenance(run_dir, grid, resumed_after_round=checkpoint.round, data=origin)
        log(INFO, "pflower run directory: %s (resumed after round %d)", run_dir, checkpoint.round)
    every = run.checkpoint_every
    if every > 0:
        encode(strategy.state_dict(), {})  # an attribute that cannot be checkpointed fails now, not after round 1
    first_round = checkpoint.round + 1 if checkpoint is not None else 1
    progress = RunProgress(run.rounds, first_round, sweep) if run.progress else None

    def on_round(record: dict[str, Any]) -> None:
        writer.append_round(record)  # metrics first: a checkpoint never runs ahead of metrics.jsonl
        if every > 0 and (record["round"] % every == 0 or record["round"] == run.rounds):
            save_checkpoint(run_dir, strategy.state_dict())
        if progress is not None:
            log(INFO, "%s", progress.line(int(record["round"]), record.get("round_time_s")))

    t0 = time.perf_counter()
    strategy.start(grid, num_rounds=run.rounds, timeout=run.round_timeout, on_round=on_round)
    summary: dict[str, Any] = {
        "method": plan.method,
        "dataset": run.dataset,
        **data_record(plan, strategy),
        "model": run.model,
        "num_clients": run.num_clients,
        **summarize(writer.rounds, run.headline_window),
        **{k: v for k, v in strategy.final_metrics.items() if k != "dropped"},
        **strategy_summary(strategy),
        # every segment of a resumed run (rounds a crash lost after their checkpoint not counted)
        "wall_time_s": strategy.elapsed_before + (time.perf_counter() - t0),
        "run_dir": str(run_dir),
        **resume_record(run_dir, writer.rounds),
    }
    artifacts = strategy.write_artifacts(run_dir)
    if artifacts:
        summary["artifacts"] = [str(Path(a).name) for a in artifacts]
    writer.write_summary(summary)
    writer.plot(f"{plan.method} on {run.dataset}")
    for line in summary_table(summary).splitlines():
        log(INFO, "%s", line)
    return summary


def data_record(plan: RunPlan, strategy: PersonalizedStrategy) -> dict[str, Any]:
    """The summary's partition, alpha (and for node-held data, where it came from).

    With ``dataset=local`` the config's partition keys say nothing about the data: each node
    reports its directory's meta.json at discovery, and the run records what they report (the
    partition the directories were exported from, if they all agree)."""
    if not plan.data.info.node_local:
        return {
            "partition": plan.run.partition,
            "alpha": plan.run.alpha,
            **data_origin(plan.data),
        }
    origins = {cid: info.origin for cid, info in sorted(strategy.clients.items())}
    exported = [o.get("exported_from") if isinstance(o, dict) else None for o in origins.values()]
    names = sorted({str(o.get("name")) for o in origins.values() if isinstance(o, dict) and o.get("name")})
    record: dict[str, Any] = {"data_source": "nodes", "node_dataset": names[0] if len(names) == 1 else names or None}
    keys = ("dataset", "partitioner", "alpha", "num_clients", "seed")
    described = [tuple(e.get(k) for k in keys) for e in exported if isinstance(e, dict)]
    if exported and len(described) == len(exported) and len(set(described)) == 1:
        dataset, partitioner, alpha, num_clients, seed = described[0]
        record.update(
            {
                "partition": partitioner,
                "alpha": alpha if partitioner == "dirichlet" else None,
                "node_dataset": dataset,
                "partition_clients": num_clients,
                "partition_seed": seed,
            }
        )
    elif described:
        record.update({"partition": "mixed", "alpha": None, "node_partitions": sorted({str(d) for d in described})})
    else:  # the nodes' own data: no partition to speak of
        record.update({"partition": "node-local", "alpha": None})
    return record


def resume_record(run_dir: Path, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """What the summary says of a run's segments: the rounds it was resumed after (from
    provenance.json) and the clients that had lost their state at a forced resume."""
    from .provenance import read_provenance

    resumes = [int(r["after_round"]) for r in (read_provenance(run_dir) or {}).get("resumes", []) if "after_round" in r]
    out: dict[str, Any] = {}
    if resumes:
        out["resumed_after_rounds"] = resumes  # one key: the last resume is its last entry
    lost = {int(r["round"]): list(r["client_state_lost"]) for r in rounds if r.get("client_state_lost")}
    if lost:
        out["client_state_lost"] = {str(k): v for k, v in lost.items()}  # round -> clients
    return out


def resumable(plan: RunPlan) -> Checkpoint:
    """The checkpoint of ``plan.run.resume``, after checking that the plan's config continues that
    run unchanged (its record against the run's config.yaml)."""
    run_dir = Path(str(plan.run.resume)).expanduser().resolve()
    checkpoint = load_checkpoint(run_dir)
    diff = differs_from_saved(plan.record, run_dir)
    if diff:
        raise ConfigError(
            f"resume={run_dir}: the config differs from the run's config.yaml in {[d[0] for d in diff][:8]}; "
            "plan it with server_app.run_plan.plan_run([..., 'resume=<dir>']), which takes the saved one"
        )
    if checkpoint.method != plan.method:
        raise CheckpointError(
            f"{checkpoint.path} is a {checkpoint.method} checkpoint but the run's method is {plan.method}"
        )
    if plan.run.rounds < checkpoint.round:
        raise ConfigError(
            f"resume={run_dir}: the checkpoint is at round {checkpoint.round}; rounds={plan.run.rounds} is fewer"
        )
    return checkpoint


def restore_metrics(run_dir: Path, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Make metrics.jsonl hold rounds 1..R of the checkpoint's history exactly once.

    Lines after round R (written before a crash that came before their checkpoint) and torn
    lines move to ``metrics.discarded.jsonl``, never deleted; those rounds run again. If the
    file does not hold rounds 1..R, it is rebuilt from the checkpoint's history.
    """
    path = run_dir / "metrics.jsonl"
    last = int(history[-1]["round"]) if history else 0
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    kept: list[str] = []
    rounds: list[dict[str, Any]] = []
    discarded: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            keep = isinstance(record, dict) and int(record["round"]) <= last
        except (ValueError, KeyError, TypeError):
            keep = False
        if keep:
            kept.append(line)
            rounds.append(record)
        else:
            discarded.append(line)
    if [int(r["round"]) for r in rounds] != list(range(1, last + 1)):
        log(WARNING, "%s does not hold rounds 1..%d once each: rewriting it from the checkpoint", path, last)
        discarded = [line for line in lines if line.strip()]
        rounds = json.loads(json.dumps(jsonable(history)))
        kept = [json.dumps(r, sort_keys=True) for r in rounds]
    if discarded:
        with open(run_dir / "metrics.discarded.jsonl", "a", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in discarded)
        atomic_write(path, "".join(line + "\n" for line in kept))
        log(
            WARNING, "%d line(s) of %s after round %d moved to metrics.discarded.jsonl", len(discarded), path.name, last
        )
    return rounds


def strategy_summary(strategy: PersonalizedStrategy) -> dict[str, Any]:
    """Method-specific values for the summary (e.g. FedCMD's selected layer)."""
    return dict(strategy.run_summary())


def summary_table(summary: dict[str, Any]) -> str:
    """The final summary as a small Markdown table (accuracies in percent)."""
    rows = ["", "| pflower summary | |", "|---|---|"]
    for key, value in summary.items():
        if isinstance(value, float):
            value = f"{100 * value:.2f}%" if "acc" in key else f"{value:.3f}"
        elif isinstance(value, (list, tuple)):
            value = format_value(value)  # per-layer lists: 4 significant digits (summary.json keeps them all)
        elif isinstance(value, dict) and len(value) > 8:  # one value per client: the file has them
            value = f"{len(value)} entries, in summary.json"
        rows.append(f"| {key} | {value} |")
    return "\n".join(rows)
