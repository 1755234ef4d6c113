"""``pflower sim``: simulate runs on this machine.

``pflower sim key=value ...`` composes conf/ exactly like `flwr run .` does and runs it
in-process through Flower's simulation engine, one simulated SuperNode per client;
``pflower sim -m method=fedavg,fedper`` sweeps (hydra multirun).
"""

from __future__ import annotations

import json
import sys

from omegaconf import DictConfig, OmegaConf

from pflower.server_app.config import (
    ConfigError,
    conf_dir,
    leave_out_other_methods_options,
    register_method_options,
    resume_config,
    validate,
)
from pflower.server_app.progress import Sweep, job_label, parse_sweep

from .simulate import simulate


def split_sweep(value: str) -> list[str]:
    """``a,b`` -> [a, b]; a value with brackets, quotes or a sweep function is kept whole."""
    if "," not in value or any(c in value for c in "[]{}()'\""):
        return [value]
    return value.split(",")


def sweep_combinations(argv: list[str]) -> list[list[str]]:
    """The overrides of every run a command line asks for: one list for a single run; for ``-m``
    every combination of the swept values (hydra's basic sweeper: the cartesian product)."""
    import itertools

    overrides = [
        a
        for a in argv
        if ("=" in a or a.startswith("~"))  # `~key` deletes a key (what a model-mismatch error advises)
        and not a.startswith("-")
        and not a.split("=", 1)[0].lstrip("+~").startswith("hydra")
    ]

    def values(o: str) -> list[str]:
        key, eq, value = o.partition("=")
        return [f"{key}={v}" for v in split_sweep(value)] if eq else [o]

    if "-m" not in argv and "--multirun" not in argv:
        return [[values(o)[0] for o in overrides]]
    return [list(c) for c in itertools.product(*(values(o) for o in overrides))]


def precheck(argv: list[str]) -> DictConfig | None:
    """Compose and validate the command line's config before hydra runs it: one line for an unknown
    key or group choice, a value of the wrong type or range. A sweep (``-m``) goes further: every
    combination is composed, validated and its strategy built (as a single run is before it
    starts), and the data partition made once per distinct data set-up, so a sweep that would stop
    halfway is refused before its first run, with every bad combination listed."""
    from pflower.server_app.config import compose_config, data_spec_dict
    from pflower.server_app.failures import USER_ERRORS
    from pflower.server_app.runner import check_data, check_strategy

    sweep = "-m" in argv or "--multirun" in argv
    if not sweep and plain_single_run(argv):
        return compose_config(sweep_combinations(argv)[0])  # composed and validated once: it runs as it is
    problems: list[str] = []
    seen_data: dict[str, str | None] = {}
    combos = sweep_combinations(argv)
    varying = {i for i in range(len(combos[0])) if len({c[i] for c in combos}) > 1} if combos else set()
    for combo in combos:
        if any("(" in c for c in combo):  # hydra sweep functions (range, glob...) are hydra's to expand
            continue
        try:
            cfg = compose_config(combo)
            if sweep:
                check_strategy(cfg)
                key = json.dumps(data_spec_dict(cfg), sort_keys=True, default=str)
                if key not in seen_data:
                    try:
                        check_data(cfg)
                        seen_data[key] = None
                    except USER_ERRORS as exc:
                        seen_data[key] = str(exc)
                if seen_data[key]:
                    raise ConfigError(seen_data[key])
        except USER_ERRORS as exc:
            if not sweep:
                raise
            label = " ".join(c for i, c in enumerate(combo) if i in varying) or " ".join(combo) or "(defaults)"
            problems.append(f"  {label}: {exc}")
    if len(problems) == 1:
        raise ConfigError(f"the sweep's run {problems[0].strip()} (no run of the sweep was started)")
    if problems:
        raise ConfigError(
            f"{len(problems)} of the sweep's runs cannot start, so none was started; fix or drop these:\n"
            + "\n".join(problems)
        )
    return None


def plain_single_run(argv: list[str]) -> bool:
    """A single run of ``key=value`` overrides only (no hydra flag or ``hydra.*`` key, no value hydra
    would read as a sweep): ``pflower sim`` runs the config :func:`precheck` composed instead of
    handing the command line to hydra to compose again."""
    for arg in argv:
        key, eq, value = arg.partition("=")
        deletion = not eq and arg.startswith("~")
        if (not eq and not deletion) or arg.startswith("-") or key.lstrip("+~").startswith("hydra"):
            return False
        if len(split_sweep(value)) > 1:
            return False
    return True


def _sweep_job(argv: list[str], sweeps: list[Sweep]) -> Sweep | None:
    """The current hydra job's place in its multirun sweep (None for a single run).

    The sweep's size is not in hydra's job config: it is worked out once from the command
    line and ``hydra.sweeper.params``, as the basic sweeper expands them.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return None
    if not sweeps:
        params = hc.sweeper.get("params") if "sweeper" in hc else None
        total, swept = parse_sweep(argv, OmegaConf.to_container(params) if params else None)
        sweeps.append(Sweep(total, swept))
    sweep = sweeps[0]
    sweep.start_job(int(hc.job.num), job_label(list(hc.overrides.task), sweep.swept))
    return sweep


def forced_method_options(argv: list[str]) -> list[str]:
    """A sweep over methods with a ``method.<option>=`` beside it (``-m method=kapc,kapc_bls
    method.lam=0.5``): hydra composes its primary config with the default method first, which has
    no such option, and stops with "Key 'lam' is not in struct". Handed to hydra as
    ``++method.<option>=`` (set or add), every run gets the value; :func:`precheck` has composed
    each combination with the plain override already, so a typo or an option one of the methods
    lacks was refused before this."""
    swept = any(a.partition("=")[0].lstrip("+") == "method" and len(split_sweep(a.partition("=")[2])) > 1 for a in argv)
    if not swept:
        return argv
    return [f"++{a}" if a.startswith("method.") and "=" in a else a for a in argv]


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
    import hydra

    from pflower.protocol.logs import quiet_flower_logs
    from pflower.server_app.config import sim_help

    if "--help" in argv or "-h" in argv:  # not hydra's generic page
        print(sim_help())
        return 0
    quiet_flower_logs()
    from pflower.server_app.failures import USER_ERRORS

    sweeps: list[Sweep] = []
    register_method_options()  # the methods' option defaults, which conf/method/*.yaml start from

    @hydra.main(version_base=None, config_path=str(conf_dir()), config_name="config")
    def _run(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        OmegaConf.resolve(cfg)
        leave_out_other_methods_options(cfg, HydraConfig.get().overrides.task)
        sweep = _sweep_job(argv, sweeps)
        try:
            if cfg.get("resume"):  # the run's saved config, with the command line's rounds
                cfg = resume_config(cfg, HydraConfig.get().overrides.task)
            validate(cfg)
            simulate(cfg, sweep)
        except USER_ERRORS as exc:
            # hydra would print a traceback for an Exception; a SystemExit passes through it
            print(f"pflower: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        finally:
            if sweep is not None:
                sweep.end_job()

    from .sweep_jobs import parse_jobs, run_concurrently

    try:
        jobs, argv = parse_jobs(argv)
        together = "--together" in argv
        argv = [a for a in argv if a != "--together"]
        sweep_mode = "-m" in argv or "--multirun" in argv
        if together:
            return _together_main(argv, jobs)
        if jobs > 1 and not sweep_mode:
            raise ConfigError("--jobs runs a sweep's runs at once: add -m (e.g. pflower sim -m seed=1,2,3 --jobs 2)")
        combos = sweep_combinations(argv) if jobs > 1 else []
        if any("(" in o for combo in combos for o in combo):
            raise ConfigError(
                "--jobs needs the sweep's values listed (a,b,c); hydra sweep functions such as range() run without it"
            )
        single = precheck(argv)
    except (*USER_ERRORS, ValueError) as exc:
        print(f"pflower: {exc}", file=sys.stderr)
        return 2
    if jobs > 1:
        return run_concurrently(combos, jobs)
    if single is not None:
        try:
            simulate(single)
        except USER_ERRORS as exc:
            print(f"pflower: {exc}", file=sys.stderr)
            return 2
        return 0
    argv = forced_method_options(argv)
    # hydra's logging left alone (`none`): its `disabled` configs run dictConfig with
    # disable_existing_loggers, which silenced Flower's logger (the round and progress lines)
    sys.argv = [
        "pflower sim",
        *argv,
        "hydra.output_subdir=null",
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
        "hydra.run.dir=.",
        "hydra.sweep.dir=.",
        "hydra.sweep.subdir=.",
    ]
    try:
        _run()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def _together_main(argv: list[str], jobs: int) -> int:
    """``pflower sim -m ... backend=batched --together``: the sweep's runs in this process, each
    round's training of all of them as one computation (:mod:`simulation.together`)."""
    from pflower.server_app.config import compose_config
    from pflower.server_app.failures import USER_ERRORS

    from .together import run_together

    try:
        if "-m" not in argv and "--multirun" not in argv:
            raise ConfigError("--together runs a sweep's runs as one computation: add -m (e.g. -m seed=1,2,3)")
        if jobs > 1:
            raise ConfigError("--together runs the whole sweep in one process: drop --jobs")
        combos = sweep_combinations(argv)
        if any("(" in o for combo in combos for o in combo):
            raise ConfigError("--together needs the sweep's values listed (a,b,c), not a hydra sweep function")
        precheck(argv)  # every combination composed, validated and its strategy and data checked
        cfgs = []
        for combo in combos:
            cfg = compose_config(combo)
            cfgs.append(resume_config(cfg, combo) if cfg.get("resume") else cfg)
        varying = {i for i in range(len(combos[0])) if len({c[i] for c in combos}) > 1}
        labels = [" ".join(o for i, o in enumerate(c) if i in varying) or f"run {k + 1}" for k, c in enumerate(combos)]
        outcomes = run_together(cfgs, labels)
    except USER_ERRORS as exc:
        print(f"pflower: {exc}", file=sys.stderr)
        return 2
    failed = [(label, out) for label, out in zip(labels, outcomes) if isinstance(out, Exception)]
    for label, exc in failed:
        print(f"pflower: the run {label} failed: {exc}", file=sys.stderr)
    return 1 if failed else 0
