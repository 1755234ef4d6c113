"""``pflower sim``: simulate runs on this machine.

``pflower sim key=value ...`` plans the run exactly like `flwr run .` does
(:func:`server_app.run_plan.plan_run`: conf/ composed with the overrides, validated, resolved
once) and runs it in-process, one simulated SuperNode per client. ``pflower sim -m
method=fedavg,fedper`` sweeps: the command line expands into one override list per run, as hydra's
basic sweeper expands a multirun (``a,b``, ``range()``, ``choice()``, ``glob()``; the cartesian
product), every run is planned by the same function before the first starts, and the runs go one
after the other (``--jobs N``: N at a time, each its own process; ``--together``: as one
computation).
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pflower.server_app.config import ConfigError
from pflower.server_app.progress import Sweep, job_label

from .simulate import simulate

if TYPE_CHECKING:
    from pflower.server_app.run_plan import RunPlan

SWEEP_FLAGS = ("-m", "--multirun")
FLAGS = (*SWEEP_FLAGS, "--together")  # with --jobs N / -j N, taken out first (sweep_jobs.parse_jobs)


def overrides_of(argv: Sequence[str]) -> list[str]:
    """The command line's overrides (``key=value``, ``~key``), its flags left out; a flag or a
    ``hydra.*`` setting ``pflower sim`` does not take is refused in one line."""
    out = []
    for arg in argv:
        if arg in FLAGS:
            continue
        key = arg.partition("=")[0].lstrip("+~")
        if arg.startswith("-"):
            raise ConfigError(
                f"pflower sim has no flag {arg}; it takes key=value overrides, -m (a sweep), --jobs N, --together "
                "and --help (`pflower sim --help`)"
            )
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            raise ConfigError(
                f"{arg}: pflower sim composes conf/ itself and starts no hydra app, so hydra's own settings have no "
                "effect; drop it (a run writes under output_dir=<folder>)"
            )
        if "=" not in arg and not arg.startswith("~"):
            raise ConfigError(f"{arg!r} is not an override: write key=value (e.g. method=fedper) or ~key to drop a key")
        out.append(arg)
    return out


def expand_sweep(overrides: Sequence[str]) -> list[list[str]]:
    """Every run's overrides of a ``-m`` sweep, in the order hydra's basic sweeper runs them: each
    swept value (``a,b``, ``range(1,4)``, ``choice(...)``, ``glob(fed*)`` over a config group's
    files) once, the cartesian product over the swept keys; an override that sweeps nothing stays as
    written (``~model.fc_layers`` too)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from pflower.server_app.config import conf_dir, register_method_options

    register_method_options()  # glob(...) over method files lists the registered methods' files
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base=None, config_dir=str(conf_dir())):
            parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
            choices: dict[str, list[str]] = {}
            for override in parser.parse_overrides(list(overrides)):
                key = override.get_key_element()
                if override.is_sweep_override():
                    if not override.is_discrete_sweep():
                        raise ConfigError(
                            f"{override.input_line}: an interval sweep has no list of runs; list the values "
                            "(a,b,c) or use range(start,stop,step)"
                        )
                    choices.pop(key, None)  # a key given twice: the last one, at its place, as hydra does
                    choices[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
                else:
                    choices.pop(key, None)
                    choices[key] = [override.input_line]
    except HydraException as exc:
        raise ConfigError(f"the sweep cannot be expanded: {exc}") from None
    finally:
        GlobalHydra.instance().clear()
    return [list(c) for c in itertools.product(*choices.values())]


def runs_of(argv: Sequence[str]) -> list[list[str]]:
    """The overrides of every run the command line asks for: one list for a single run (a value
    such as ``a,b`` then is hydra's to refuse, with the advice to add ``-m``), every combination of
    the swept values for a sweep."""
    overrides = overrides_of(argv)
    if not any(a in SWEEP_FLAGS for a in argv):
        return [overrides]
    return expand_sweep(overrides)


def swept_keys(runs: Sequence[Sequence[str]]) -> list[str]:
    """The keys whose value differs between the runs (they label each run)."""
    values: dict[str, set[str]] = {}
    for run in runs:
        for override in run:
            key, _, value = override.partition("=")
            values.setdefault(key, set()).add(value)
    return [key for key, seen in values.items() if len(seen) > 1]


def run_label(run: Sequence[str], swept: Sequence[str], k: int) -> str:
    """``method=fedper seed=2``: the run's swept values (``run k`` when nothing varies)."""
    return job_label(run, swept) or f"run {k + 1}"


def plan_sweep(runs: Sequence[Sequence[str]]) -> list[RunPlan]:
    """Every run of a sweep planned, its strategy built and its data partition made (once per
    distinct data set-up), before any run starts: a sweep that would stop halfway is refused
    before its first run, with every bad run listed."""
    from pflower.server_app.failures import USER_ERRORS
    from pflower.server_app.run_plan import plan_run
    from pflower.server_app.runner import check_data, check_strategy

    problems: list[str] = []
    plans: list[RunPlan] = []
    data_problem: dict[str, str | None] = {}
    swept = swept_keys(runs)
    for k, run in enumerate(runs):
        try:
            plan = plan_run(run)
            check_strategy(plan)
            key = json.dumps(plan.data_fields, sort_keys=True, default=str)
            if key not in data_problem:
                try:
                    check_data(plan)
                    data_problem[key] = None
                except USER_ERRORS as exc:
                    data_problem[key] = str(exc)
            if data_problem[key]:
                raise ConfigError(data_problem[key])
            plans.append(plan)
        except USER_ERRORS as exc:
            label = job_label(run, swept) or " ".join(run) or "(defaults)"
            problems.append(f"  {label}: {exc}")
    if len(problems) == 1:
        raise ConfigError(f"the sweep's run {problems[0].strip()} (no run of the sweep was started)")
    if problems:
        raise ConfigError(
            f"{len(problems)} of the sweep's runs cannot start, so none was started; fix or drop these:\n"
            + "\n".join(problems)
        )
    return plans


def sim_main(argv: list[str]) -> int:
    """``pflower sim``: 0 when every run completed, 1 when one failed, 2 for a bad setting, 130 after Ctrl-C."""
    from pflower.server_app.interrupt import EXIT_INTERRUPTED, ctrl_c_stops_the_run, interrupted_line

    with ctrl_c_stops_the_run():
        try:
            return _sim_main(argv)
        except KeyboardInterrupt as exc:
            sweep = "-m" in argv or "--multirun" in argv
            line = interrupted_line(exc, "pflower sim resume={run_dir}")
            print(line + (" (the sweep stopped with this run: its later runs did not start)" if sweep else ""))
            return EXIT_INTERRUPTED


def _sim_main(argv: list[str]) -> int:
    from pflower.logs import quiet_flower_logs
    from pflower.server_app.config import sim_help
    from pflower.server_app.failures import USER_ERRORS

    from .sweep_jobs import parse_jobs, run_concurrently

    if "--help" in argv or "-h" in argv:  # not hydra's generic page
        print(sim_help())
        return 0
    quiet_flower_logs()
    try:
        jobs, argv = parse_jobs(argv)
        together = "--together" in argv
        sweep_mode = any(a in SWEEP_FLAGS for a in argv)
        if together and not sweep_mode:
            raise ConfigError("--together runs a sweep's runs as one computation: add -m (e.g. -m seed=1,2,3)")
        if together and jobs > 1:
            raise ConfigError("--together runs the whole sweep in one process: drop --jobs")
        if jobs > 1 and not sweep_mode:
            raise ConfigError("--jobs runs a sweep's runs at once: add -m (e.g. pflower sim -m seed=1,2,3 --jobs 2)")
        runs = runs_of(argv)
        if sweep_mode:
            plans = plan_sweep(runs)  # every run planned and checked before the first starts
        else:
            from pflower.server_app.run_plan import plan_run

            plans = [plan_run(runs[0])]
    except (*USER_ERRORS, ValueError) as exc:
        print(f"pflower: {exc}", file=sys.stderr)
        return 2
    if jobs > 1:
        return run_concurrently(runs, jobs)
    swept = swept_keys(runs)
    labels = [run_label(run, swept, k) for k, run in enumerate(runs)]
    if together:
        return _together(plans, labels)
    sweep = Sweep(len(plans), swept) if sweep_mode else None
    for k, plan in enumerate(plans):
        if sweep is not None:
            sweep.start_job(k, job_label(runs[k], swept))
        try:
            simulate(plan, sweep)
        except USER_ERRORS as exc:
            print(f"pflower: {exc}", file=sys.stderr)
            if sweep is not None and k + 1 < len(plans):
                print(f"pflower: the sweep stopped with run {k + 1} of {len(plans)} ({labels[k]})", file=sys.stderr)
            return 2
        finally:
            if sweep is not None:
                sweep.end_job()
    return 0


def _together(plans: list[RunPlan], labels: list[str]) -> int:
    """``pflower sim -m ... backend=batched --together``: the sweep's runs in this process, each
    round's training of all of them as one computation (:mod:`simulation.together`)."""
    from pflower.server_app.failures import USER_ERRORS

    from .together import run_together

    try:
        outcomes = run_together(plans, labels)
    except USER_ERRORS as exc:
        print(f"pflower: {exc}", file=sys.stderr)
        return 2
    failed = [(label, out) for label, out in zip(labels, outcomes) if isinstance(out, Exception)]
    for label, exc in failed:
        print(f"pflower: the run {label} failed: {exc}", file=sys.stderr)
    return 1 if failed else 0
