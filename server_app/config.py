"""Config composition: conf/ (hydra) + the run-config of `flwr run` + command-line overrides.

Both entry points end here: the ServerApp turns ``context.run_config`` into hydra
overrides, ``pflower sim`` passes its command line; both compose the same ``conf/``.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import textwrap
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict

# the config groups (group=choice), in the order `pflower sim --help` lists them
GROUPS = ("method", "dataset", "model", "partition", "experiment")
# keys a resumed run may set differently from the run it continues (output_dir is ignored: the
# run directory is given); everything else comes from the run's saved config.yaml
RESUME_FREE = ("resume", "rounds", "round_timeout", "checkpoint_every", "progress", "resume_force", "output_dir")
RESUME_CHANGEABLE = RESUME_FREE[1:6]  # what a resume's command line may set (resume itself and output_dir aside)


class ConfigError(ValueError):
    """A setting that cannot work; the message names it and the fix."""


def conf_dir() -> Path:
    """The conf/ directory, from a source checkout, an installed wheel or an unpacked FAB."""
    module = importlib.import_module("pflower.conf")
    path = Path(module.__file__).resolve().parent
    if not (path / "config.yaml").exists():
        raise ConfigError(f"{path} has no config.yaml: another module named 'conf' shadows pflower's")
    return path


OPTIONS_GROUP = "method_options"


def register_method_options() -> None:
    """Each method's options dataclass as hydra's config ``method_options/<name>``.

    ``conf/method/<name>.yaml`` starts from it (``defaults: [/method_options/<name>@_here_]``) and
    adds only its ``name`` and the values that are the run's (``total_rounds: ${rounds}``), so a
    default is declared once, in the dataclass, and ``method.<option>=`` still finds its key. Called
    before every composition: a method registered since (a user's) joins too.
    """
    from hydra.core.config_store import ConfigStore

    from pflower.strategies import STRATEGIES

    store = ConfigStore.instance()
    for name, cls in STRATEGIES.items():
        store.store(group=OPTIONS_GROUP, name=name, node={"name": name, **cls.options_type.defaults()})


def method_defaults(method: str) -> dict[str, Any]:
    """What ``method=<method>`` sets before any override: its options' defaults with its
    conf/method file's own keys on top (``name``; ``total_rounds: ${rounds}`` left unresolved)."""
    import yaml

    from pflower.strategies import STRATEGIES

    path = conf_dir() / "method" / f"{method}.yaml"
    own = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    cls = STRATEGIES.get(method)
    declared = cls.options_type.defaults() if cls is not None else {}
    return {"name": method, **declared, **{k: v for k, v in own.items() if k != "defaults"}}


def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose conf/config.yaml with hydra overrides (``key=value``, ``method=fedavg``...)."""
    register_method_options()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base=None, config_dir=str(conf_dir())):
            cfg = compose(config_name="config", overrides=list(overrides))
    except HydraException as exc:
        raise ConfigError(explain_override_error(exc, overrides)) from exc
    finally:
        if GlobalHydra.instance().is_initialized():
            GlobalHydra.instance().clear()
    OmegaConf.resolve(cfg)
    leave_out_other_methods_options(cfg, overrides)
    if cfg.get("resume"):
        cfg = resume_config(cfg, overrides)
    validate(cfg)
    return cfg


def experiment_method(name: str) -> tuple[str | None, set[str]]:
    """The method file an experiment picks (``override /method: X``) and the ``method.*`` keys it
    sets, through the experiments it extends (``defaults: [fedtsdp_fmnist]``)."""
    import yaml

    path = conf_dir() / "experiment" / f"{name}.yaml"
    if not path.exists():
        return None, set()
    raw = yaml.safe_load(path.read_text()) or {}
    picked, keys = None, set(raw.get("method") or {})
    for entry in raw.get("defaults") or []:
        if isinstance(entry, str) and entry != "_self_":
            parent, parent_keys = experiment_method(entry)
            picked, keys = picked or parent, keys | parent_keys
        elif isinstance(entry, dict):
            for k, v in entry.items():
                if str(k).split()[-1].strip("/") == "method":
                    picked = str(v)
    return picked, keys


_SAID: set[str] = set()


def leave_out_other_methods_options(cfg: DictConfig, overrides: Iterable[str]) -> None:
    """``experiment=fedcpmd_fmnist method=fedavg``: the experiment's set-up with another method.
    The ``method.*`` values the experiment file sets for its own method (FedCPMD's ``kp``) are left
    out when the method chosen on the command line has no such option, with one log line; an
    option the command line itself names is kept, so a typo still fails in validation."""
    overrides = [str(o) for o in overrides]
    given = {_override_key(o): o.split("=", 1)[-1] for o in overrides if "=" in o}
    if "experiment" not in given or "method" not in given:
        return
    picked, keys = experiment_method(given["experiment"])
    if picked is None or picked == given["method"]:
        return
    from pflower.strategies import STRATEGIES

    cls = STRATEGIES.get(str(cfg.method.get("name")))
    if cls is None:
        return  # validation names the unknown method
    foreign = sorted(
        k for k in keys if k not in cls.options_type.names() and f"method.{k}" not in given and k in cfg.method
    )
    if foreign:
        from logging import INFO

        from flwr.common import log

        line = (
            f"experiment={given['experiment']} sets {', '.join(f'method.{k}' for k in foreign)} for method "
            f"{picked}; method={given['method']} has no such option(s), left out"
        )
        if line not in _SAID:  # pflower sim composes twice (the check before hydra, then hydra's run)
            _SAID.add(line)
            log(INFO, "%s", line)
        with open_dict(cfg):
            for k in foreign:
                del cfg.method[k]


def group_choices(group: str) -> list[str]:
    """The files of a config group (``conf/<group>/*.yaml``), by name."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


OPTION_GROUPS = ("method", "dataset", "model", "partition")  # groups whose chosen file brings its own keys


def _defaults_choices(path: Path) -> dict[str, str]:
    """``{group: choice}`` of a config file's defaults list (``- method: fedcmd``, ``- override /method: x``);
    in an experiment file, an entry naming another experiment (``- fedcmd_paper``) brings that one's first."""
    import yaml

    out: dict[str, str] = {}
    for item in (yaml.safe_load(path.read_text()) or {}).get("defaults") or []:
        nested = path.parent / f"{item}.yaml" if isinstance(item, str) and item != "_self_" else None
        if nested is not None and path.parent.name == "experiment" and nested.exists():
            out.update(_defaults_choices(nested))
        elif isinstance(item, dict):
            for key, value in item.items():
                group = str(key).replace("override", "").strip().lstrip("/")
                if group in OPTION_GROUPS and isinstance(value, str):
                    out[group] = value
    return out


def chosen_files(overrides: Iterable[str]) -> dict[str, str]:
    """The file each option group resolves to for these command-line overrides: config.yaml's
    defaults, then the experiment's, then ``group=choice`` on the command line."""
    overrides = list(overrides)
    chosen = _defaults_choices(conf_dir() / "config.yaml")
    experiment = next(
        (o.split("=", 1)[1] for o in reversed(overrides) if o.split("=", 1)[0].lstrip("+~") == "experiment"), None
    )
    if experiment and (conf_dir() / "experiment" / f"{experiment}.yaml").exists():
        chosen.update(_defaults_choices(conf_dir() / "experiment" / f"{experiment}.yaml"))
    for o in overrides:
        key, eq, value = o.partition("=")
        if eq and key.lstrip("+~") in OPTION_GROUPS and (conf_dir() / key.lstrip("+~") / f"{value}.yaml").exists():
            chosen[key.lstrip("+~")] = value
    return chosen


def config_keys(chosen: Mapping[str, str] | None = None) -> list[str]:
    """Every settable key of conf/config.yaml, dotted (``lr``, ``lr_schedule.kind``...), and the
    options of the group files: only the chosen file's where ``chosen`` names one (so a suggestion
    never offers another method's option), every file's otherwise."""
    import yaml

    raw = yaml.safe_load((conf_dir() / "config.yaml").read_text()) or {}

    def walk(node: Any, prefix: str) -> list[str]:
        if isinstance(node, dict):
            return [
                k
                for key, v in node.items()
                if key != "defaults"
                for k in [prefix + str(key), *walk(v, prefix + str(key) + ".")]
            ]
        return []

    keys = walk(raw, "")
    for group in OPTION_GROUPS:
        files = sorted((conf_dir() / group).glob("*.yaml"))
        if chosen and group in chosen:
            files = [p for p in files if p.stem == chosen[group]]
        for path in files:
            # a method's options are its dataclass's (its file names only what is the run's)
            own = method_defaults(path.stem) if group == "method" else yaml.safe_load(path.read_text()) or {}
            keys += [k for k in walk(own, group + ".") if k not in keys]
    return keys


def documented_keys() -> list[tuple[str, str, str]]:
    """(dotted key, default, meaning) of conf/config.yaml, read from its lines and their comments."""
    rows: list[tuple[str, str, str]] = []
    parent = ""
    for line in (conf_dir() / "config.yaml").read_text().splitlines():
        match = re.match(r"^( *)([A-Za-z_]\w*):\s*([^#]*?)\s*(?:#\s*(.*))?$", line)
        if not match or match.group(2) == "defaults":
            continue
        indent, key, value, meaning = match.groups()
        if not indent:
            parent = key if not value else ""
        elif parent:
            key = f"{parent}.{key}"
        else:
            continue
        rows.append((key, value, meaning or ""))
    return rows


def sim_help() -> str:
    """``pflower sim --help``: the keys with defaults and meanings, the groups and their choices."""
    lines = [
        "usage: pflower sim [-m [--jobs N | --together]] [key=value ...] [group=choice ...]",
        "",
        "  -m          a sweep: one run per combination of the swept values (a,b; range(1,4); glob(fed*))",
        "  --jobs N    with -m: N runs at a time, each its own process (docs/scaling.md)",
        "  --together  with -m and backend=batched: the runs in one process, each round's training of",
        "              all of them as one computation (docs/scaling.md)",
        "",
        "Keys (default, meaning):",
    ]
    for key, default, meaning in documented_keys():
        lines.append(f"  {key:<22} {default or '':<10} {meaning}".rstrip())
    lines += ["", "Groups (group=choice; a choice's own keys are set as group.key=value, e.g. method.kp=10):"]
    for group in GROUPS:
        wrapped = textwrap.wrap(", ".join(group_choices(group)), 90)
        lines += [f"  {group if i == 0 else '':<11} {part}" for i, part in enumerate(wrapped)]
    lines += [
        "",
        "Examples:",
        "  pflower sim method=fedper dataset=fmnist alpha=0.1 rounds=50",
        "  pflower sim -m method=fedavg,fedper,local alpha=0.1      (a sweep: one run per method)",
        "  pflower sim -m seed=1,2,3,4 --jobs 2                     (a sweep, two runs at a time)",
        "",
        'The same keys work in `flwr run . --run-config "key=value"` (docs/configuration.md).',
    ]
    return "\n".join(lines)


def explain_override_error(exc: Exception, overrides: Iterable[str]) -> str:
    """One line for a command-line override hydra refused: the unknown key and the closest real
    one, or the unknown group choice and the valid ones."""
    import difflib

    text = str(exc)
    missing = re.search(r"Could not find '([\w-]+)/([^']+)'", text)
    if missing and missing.group(1) in GROUPS:
        group, name = missing.groups()
        return f"unknown {group} {name!r}; valid: {', '.join(group_choices(group))}"
    key = re.search(r"Key '([^']+)' is not in struct", text) or re.search(r"Could not override '([^']+)'", text)
    if key:
        name = key.group(1)
        full = next(
            (o.split("=", 1)[0].lstrip("+~") for o in overrides if o.split("=", 1)[0].lstrip("+~").endswith(name)), name
        )
        group, _, leaf = full.rpartition(".")
        alias = KEY_ALIASES.get(leaf)
        if alias:
            close = [f"{group}.{alias}" if group else alias]
        elif full in config_keys():
            close = [full]  # another file of its group has it: said below
        else:  # among the keys of the files this command chose (another method's option would fail next)
            close = difflib.get_close_matches(full, [*config_keys(chosen_files(overrides)), *GROUPS], n=1)
        if close and close[0] == full and "." in full:  # another method/dataset/model/partition file has it
            group = full.split(".", 1)[0]
            chosen = chosen_files(overrides).get(group)
            which = f"{group} {chosen!r}" if chosen else f"the chosen {group}"
            if chosen:
                own = _file_keys(conf_dir() / group / f"{chosen}.yaml")
                listed = f"its options: {', '.join(own)}" if own else "it has no options"
                if group == "method" and own:
                    listed += f" (`pflower methods {chosen}` says what each does)"
            else:
                listed = f"its options are in conf/{group}/<name>.yaml"
            return (
                f"{which} has no option {full.split('.', 1)[1]!r} (other {group} files do); {listed}; "
                f"drop the override or pick a {group} that has it"
            )
        hint = f"did you mean {close[0]}? " if close else ""
        return (
            f"unknown key {full!r}: {hint}(the keys: docs/configuration.md and conf/config.yaml; "
            "a method's options: `pflower methods <name>`)"
        )
    ambiguous = re.search(r"Ambiguous value for argument '([^']+)'", text)
    if ambiguous:
        given = ambiguous.group(1)
        key = given.split("=", 1)[0]
        return (
            f"{given}: a comma-separated value sweeps; add -m for one run per value (pflower sim -m {given}), "
            f"or write {key}=[a,b] for a list"
        )
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return f"bad configuration override: {first}"


def _file_keys(path: Path) -> list[str]:
    """The top-level keys a config group file sets (its options), ``name`` and ``defaults`` aside;
    a method file's are its options dataclass's."""
    import yaml

    if path.parent.name == "method" and path.exists():
        return [k for k in method_defaults(path.stem) if k != "name"]
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return []
    return [k for k in raw if k not in ("name", "defaults")] if isinstance(raw, dict) else []


# names users reach for that mean another key (difflib alone offers dataset.options for data_dir)
KEY_ALIASES = {
    "data_dir": "root",
    "datadir": "root",
    "data_root": "root",
    "data_path": "root",
    "dir": "root",
    "epochs": "local_epochs",
    "num_rounds": "rounds",
    "clients": "num_clients",
    "learning_rate": "lr",
}


def resume_config(cfg: DictConfig, overrides: Iterable[str]) -> DictConfig:
    """The config of a resumed run: ``<resume>/config.yaml`` with the :data:`RESUME_FREE` keys
    that ``overrides`` set explicitly (``rounds``...). Any other explicit override must equal
    the saved value (repeating the original command line is fine); defaults never override."""
    run_dir = Path(str(cfg.resume)).expanduser().resolve()
    saved = load_saved_config(run_dir)
    touched = [_override_key(o) for o in overrides]
    known = set(_flatten(OmegaConf.to_container(saved)))
    conflicts = []
    for path, mine, theirs in config_diff(cfg, saved):
        by = [t for t in touched if t == "experiment" or path == t or path.startswith(t + ".")]
        if path not in known:  # a key pflower gained after the run began: its default is the run's behaviour
            by = [t for t in by if t == path]
        if by:
            conflicts.append(f"{path}: given {mine!r} (by `{by[0]}`), the run has {theirs!r}")
    if conflicts:
        raise ConfigError(
            f"resume={run_dir} continues that run with its saved config.yaml; only {', '.join(RESUME_CHANGEABLE)} "
            f"may change. Drop these overrides (or start a new run): {'; '.join(conflicts)}"
        )
    out = saved.copy()
    for key in RESUME_CHANGEABLE:
        if key in touched or key not in out:
            out[key] = cfg[key]
    out.resume = str(run_dir)
    planned = saved.method.get("total_rounds")
    if "rounds" in touched and planned is not None and int(out.rounds) != int(planned):
        from logging import INFO

        from flwr.common import log

        line = (
            f"resume: rounds {saved.rounds} -> {out.rounds}; method.total_rounds stays {planned}, the horizon the "
            f"method's schedule (warm-up, Kp from rho) was planned on when the run started, so the rounds already "
            f"run keep their meaning (a new run with rounds={out.rounds} plans on {out.rounds})"
        )
        if line not in _SAID:
            _SAID.add(line)
            log(INFO, "%s", line)
    return out


def load_saved_config(run_dir: Path) -> DictConfig:
    """A run directory's config.yaml; a clear error when it is missing or unreadable."""
    path = run_dir / "config.yaml"
    if not run_dir.is_dir():
        raise ConfigError(f"cannot resume: run directory {run_dir} does not exist (resume=<the run's directory>)")
    if not path.exists():
        raise ConfigError(f"cannot resume: {path} is missing; is {run_dir} a pflower run directory?")
    try:
        saved = OmegaConf.load(path)
    except Exception as exc:  # yaml errors have many types
        raise ConfigError(f"cannot resume: {path} is unreadable ({exc}); restore it or start a new run") from exc
    if not isinstance(saved, DictConfig) or "method" not in saved:
        raise ConfigError(f"cannot resume: {path} is not a pflower config")
    return saved


def differs_from_saved(record: str, run_dir: Path) -> list[tuple[str, Any, Any]]:
    """:func:`config_diff` of a plan's composed config (its YAML ``record``) and the run's saved one."""
    return config_diff(OmegaConf.create(record), load_saved_config(run_dir))


def config_diff(a: DictConfig, b: DictConfig) -> list[tuple[str, Any, Any]]:
    """``(dotted path, a's value, b's value)`` of every leaf that differs, ignoring RESUME_FREE keys."""
    fa, fb = _flatten(OmegaConf.to_container(a)), _flatten(OmegaConf.to_container(b))
    return [
        (k, fa.get(k), fb.get(k))
        for k in sorted(set(fa) | set(fb))
        if k.split(".")[0] not in RESUME_FREE and fa.get(k) != fb.get(k)
    ]


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: tree}


def _override_key(override: str) -> str:
    """``key`` of a hydra override (``key=v``, ``+key=v``, ``++key=v``, ``~key``, ``group@pkg=v``)."""
    key = str(override).split("=", 1)[0].lstrip("+~").strip()
    return key.split("@", 1)[0]


@lru_cache(maxsize=1)
def _defaults() -> dict[str, Any]:
    """conf/config.yaml's top-level values and group choices, read from the file (composing and
    validating the whole default config would be a second composition of every `flwr run`)."""
    import yaml

    path = conf_dir() / "config.yaml"
    raw = yaml.safe_load(path.read_text()) or {}
    flat = {k: v for k, v in raw.items() if k != "defaults" and not isinstance(v, dict)}
    flat.update(_defaults_choices(path))
    flat["experiment"] = ""
    flat["resume"] = flat.get("resume") or ""  # TOML has no null: flwr's run-config declares ""
    return flat


def overrides_from_run_config(run_config: dict[str, Any]) -> list[str]:
    """Hydra overrides for the run-config keys that differ from conf/'s defaults.

    Keys equal to the defaults are skipped so that an ``experiment`` file's values are not
    overwritten by the defaults `flwr run` always sends. ``overrides`` holds free-form
    hydra overrides (``"method.finetune_epochs=1 partition.min_size=20"``).
    """
    defaults = _defaults()
    out: list[str] = []
    for key, value in run_config.items():
        if key == "overrides":
            continue
        if key not in defaults:
            raise ConfigError(f"unknown run-config key {key!r}; valid keys: {sorted(defaults)} and 'overrides'")
        if value == defaults[key] or (key == "experiment" and value in ("", None)):
            continue
        out.append(f"{key}={_format(value)}")
    out += shlex.split(str(run_config.get("overrides", "") or ""))
    return out


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and any(c in value for c in " ,=[]{}'\""):
        return repr(value)
    return str(value)


# pflower sim's engines (`flwr run` runs wherever its SuperLink runs)
BACKENDS = ("batched", "parallel", "ray", "serial")

# keys that must be numbers (checked before any range, so `lr=abc` says so in one line)
NUMBERS: dict[str, type] = {
    "num_clients": int,
    "rounds": int,
    "fraction": float,
    "min_clients": int,
    "alpha": float,
    "test_fraction": float,
    "local_epochs": int,
    "lr": float,
    "batch_size": int,
    "momentum": float,
    "weight_decay": float,
    "seed": int,
    "headline_window": int,
    "round_timeout": float,
    "min_replies": int,
    "checkpoint_every": int,
}
NUMBER_EXAMPLES = {
    "num_clients": 20,
    "rounds": 30,
    "fraction": 0.5,
    "alpha": 0.3,
    "lr": 0.05,
    "batch_size": 32,
    "local_epochs": 5,
}


def _positive(value: Any, zero: bool = False) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and (value >= 0 if zero else value > 0)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# the cores one run may use, when fewer than the process's: `pflower sim -m --jobs N` gives each
# of its runs its share this way, so that `workers=auto` still applies its own rules (the CUDA cap)
CORES_ENV = "PFLOWER_CORES"


def default_workers() -> int:
    """The CPU cores this process may run on (its affinity mask, not the machine's count), or
    ``PFLOWER_CORES`` of them when that is set and smaller."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        cores = max(1, os.cpu_count() or 1)
    share = os.environ.get(CORES_ENV, "").strip()
    return min(cores, int(share)) if share.isdigit() and int(share) >= 1 else cores


# ``workers=auto`` when the clients compute on CUDA. Each worker is then a fresh process with its
# own data, torch and CUDA context; past 4 workers each doubling of that memory bought little
# round time (the measured table: docs/devices.md).
CUDA_AUTO_WORKERS = 4


def resolve_workers(value: Any, on_cuda: bool = False) -> int:
    """``workers``: ``auto`` (the usable cores; at most :data:`CUDA_AUTO_WORKERS` on CUDA) or a
    positive integer."""
    if value is None or str(value).strip().lower() == "auto":
        return min(default_workers(), CUDA_AUTO_WORKERS) if on_cuda else default_workers()
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1 or str(n) != str(value).strip():
        raise ValueError(f"workers must be 'auto' or a positive integer, got {value!r}")
    return n


def _workers_ok(value: Any) -> bool:
    try:
        resolve_workers(value)
    except ValueError:
        return False
    return True


def validate(cfg: DictConfig) -> None:
    """Check names and ranges before any round starts; every message says how to fix it (the
    first failing check, in the order: numbers, model options, names and ranges, engine, the
    federation's architectures, the method's options)."""
    from pflower.federated_data import dataset_info
    from pflower.models.schema import assign_archs
    from pflower.strategies import STRATEGIES, OptionError
    from pflower.strategies.base.schedule import LRSchedule

    _check_numbers(cfg)
    dataset_info(cfg.dataset.name)  # registers the torchvision readers, raises on unknown names
    archs, rule = model_archs(cfg)
    _check_model_options(cfg, archs)
    for ok, message in [*_name_and_range_checks(cfg, archs), *_engine_checks(cfg)]:
        if not ok:
            raise ConfigError(message)
    try:
        assign_archs(rule, list(archs), int(cfg.num_clients))
        LRSchedule.from_config({**(_plain(cfg.get("lr_schedule")) or {}), "rounds": int(cfg.rounds)})
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if len(archs) > 1 and cfg.method.name in STRATEGIES and not STRATEGIES[cfg.method.name].traits.heterogeneous:
        capable = sorted(n for n, c in STRATEGIES.items() if c.traits.heterogeneous)
        raise ConfigError(
            f"method {cfg.method.name!r} runs one architecture on every client, but model.archs names {sorted(archs)}: "
            f"use one model, or a method for heterogeneous clients ({', '.join(capable)})"
        )
    if cfg.method.name in STRATEGIES:
        try:  # the method's options dataclass: unknown keys, types and ranges, before any run starts
            STRATEGIES[cfg.method.name].options_type.build(cfg.method.name, method_args(cfg))
        except OptionError as exc:
            raise ConfigError(str(exc)) from exc


def _check_numbers(cfg: DictConfig) -> None:
    """The run's numeric keys are numbers (whole where they must be), not strings."""
    for key, kind in NUMBERS.items():
        value = OmegaConf.select(cfg, key)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (kind is int and not float(value).is_integer()):
            want = "a whole number" if kind is int else "a number"
            raise ConfigError(f"{key}={value!r} is not {want}: set it like {key}={NUMBER_EXAMPLES.get(key, 1)}")


def _check_model_options(cfg: DictConfig, archs: dict[str, dict[str, Any]]) -> None:
    """No architecture carries an option its model lacks (an experiment's LeNet-5 option on a ResNet)."""
    from pflower.models import MODELS, model_options

    for arch, spec in archs.items():
        if spec["name"] not in MODELS:
            continue
        stray = sorted(set(spec) - {"name"} - set(model_options(spec["name"])))
        if stray:
            where = "model" if model_spec(cfg).get("name") != MIXED else f"model.archs.{arch}"
            raise ConfigError(
                f"model {spec['name']!r} has no option {', '.join(map(repr, stray))} (its options: "
                f"{model_options(spec['name'])}); an experiment file may have set it for another model: "
                f"drop it with {' '.join(f'~{where}.{k}' for k in stray)}"
            )


def _name_and_range_checks(cfg: DictConfig, archs: dict[str, dict[str, Any]]) -> list[tuple[bool, str]]:
    """(holds, the message when it does not) for the group choices and the run's ranges."""
    from pflower.federated_data import DATASETS
    from pflower.federated_data.partition import PARTITIONERS
    from pflower.models import MODELS
    from pflower.strategies import STRATEGIES

    unknown_models = sorted({spec["name"] for spec in archs.values()} - set(MODELS))
    checks = [
        (cfg.method.name in STRATEGIES, f"unknown method {cfg.method.name!r}; valid methods: {sorted(STRATEGIES)}"),
        (cfg.dataset.name in DATASETS, f"unknown dataset {cfg.dataset.name!r}; valid datasets: {sorted(DATASETS)}"),
        (
            not unknown_models,
            f"unknown model {', '.join(map(repr, unknown_models))}; valid models: {sorted(MODELS)} (or mixed)",
        ),
        (cfg.partition.name in PARTITIONERS, f"unknown partition {cfg.partition.name!r}; valid: {list(PARTITIONERS)}"),
        (
            cfg.partition.name != "file" or bool(cfg.partition.get("path")),
            "partition=file needs partition.path=<JSON file of each client's indices> (docs/configuration.md)",
        ),
        (
            cfg.dataset.name != "hf" or bool((cfg.dataset.get("options") or {}).get("path")),
            "dataset=hf needs dataset.options.path=<hub id or local directory>, e.g. zalando-datasets/fashion_mnist",
        ),
        (cfg.num_clients >= 1, f"num_clients must be >= 1, got {cfg.num_clients}"),
        (cfg.rounds >= 1, f"rounds must be >= 1, got {cfg.rounds}"),
        (
            cfg.get("checkpoint_every", 1) >= 0,
            f"checkpoint_every must be >= 0 (0: never), got {cfg.get('checkpoint_every')}",
        ),
        (0 < cfg.fraction <= 1, f"fraction must be in (0, 1], got {cfg.fraction}"),
        (cfg.local_epochs >= 0, f"local_epochs must be >= 0, got {cfg.local_epochs}"),
        (cfg.lr > 0, f"lr must be > 0, got {cfg.lr}"),
        (cfg.batch_size >= 2, f"batch_size must be >= 2 (BatchNorm), got {cfg.batch_size}"),
        (0 < cfg.test_fraction < 1, f"test_fraction must be in (0, 1), got {cfg.test_fraction}"),
    ]
    if cfg.partition.name == "dirichlet":
        checks.append((cfg.partition.alpha > 0, f"Dirichlet alpha must be > 0, got {cfg.partition.alpha}"))
    return checks


def _engine_checks(cfg: DictConfig) -> list[tuple[bool, str]]:
    """(holds, the message when it does not) for the switches, the engine's keys and the optimizer."""
    from pflower.protocol.wire import OPTIMIZER_STATES, OPTIMIZERS

    ray_cfg = cfg.get("ray") or {}
    return [
        (
            isinstance(cfg.get("deterministic", False), bool),
            f"deterministic must be true or false, got {cfg.get('deterministic')!r}",
        ),
        (
            isinstance(cfg.get("resume_force", False), bool),
            f"resume_force must be true or false, got {cfg.get('resume_force')!r}",
        ),
        (
            cfg.get("backend", "ray") in BACKENDS,
            f"backend must be one of {list(BACKENDS)} (pflower sim), got {cfg.get('backend')!r}",
        ),
        (
            not ray_cfg.get("address") or cfg.get("backend", "ray") == "ray",
            f"ray.address is set but backend={cfg.get('backend')}: add backend=ray to run on that Ray cluster",
        ),
        (
            _positive(ray_cfg.get("client_cpus", 1)),
            f"ray.client_cpus must be a number > 0, got {ray_cfg.get('client_cpus')!r}",
        ),
        (
            ray_cfg.get("client_gpus", "auto") == "auto" or _positive(ray_cfg.get("client_gpus"), zero=True),
            f"ray.client_gpus must be auto or a number >= 0 (0.25: four actors share a GPU), got "
            f"{ray_cfg.get('client_gpus')!r}",
        ),
        (
            _positive_int(cfg.get("batch_clients", 64)),
            f"batch_clients must be a positive whole number (backend=batched), got {cfg.get('batch_clients')!r}",
        ),
        (
            _workers_ok(cfg.get("workers", "auto")),
            f"workers must be 'auto' or a positive whole number (backend=parallel), got {cfg.get('workers')!r}",
        ),
        (
            cfg.get("optimizer", "sgd") in OPTIMIZERS,
            f"optimizer must be one of {list(OPTIMIZERS)}, got {cfg.get('optimizer')!r}",
        ),
        (
            cfg.get("optimizer_state", "fresh") in OPTIMIZER_STATES,
            f"optimizer_state must be one of {list(OPTIMIZER_STATES)}, got {cfg.get('optimizer_state')!r}",
        ),
        (
            cfg.get("local_steps") is None or int(cfg.local_steps) >= 1,
            f"local_steps must be >= 1 (or null: local_epochs), got {cfg.get('local_steps')}",
        ),
    ]


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if isinstance(value, DictConfig) else value


def method_args(cfg: DictConfig) -> dict[str, Any]:
    return {k: v for k, v in OmegaConf.to_container(cfg.method).items() if k != "name"}


MIXED = "mixed"  # model.name of a heterogeneous federation: model.archs holds the architectures


def model_spec(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg.model)


def model_archs(cfg: DictConfig) -> tuple[dict[str, dict[str, Any]], Any]:
    """(architecture name -> model spec, assignment rule). A homogeneous run is one architecture
    named after its model; ``model=<a mixed config>`` lists several under ``model.archs``
    (``conf/model/felo_previous.yaml``) and says who runs which in ``model.assign``."""
    spec = model_spec(cfg)
    if spec.get("name") != MIXED:
        return {str(spec["name"]): spec}, "blocks"
    archs = spec.get("archs") or {}
    if not isinstance(archs, dict) or not archs:
        raise ConfigError(
            "model.name=mixed needs model.archs: a mapping architecture name -> model spec, e.g. {small: {name: "
            "resnet10}, big: {name: resnet18}}"
        )
    out = {}
    for arch, arch_spec in archs.items():
        if isinstance(arch_spec, str):
            arch_spec = {"name": arch_spec}
        if not isinstance(arch_spec, dict) or "name" not in arch_spec:
            raise ConfigError(
                f"model.archs.{arch} must be a model spec with a name (e.g. {{name: resnet18}}), got {arch_spec!r}"
            )
        out[str(arch)] = dict(arch_spec)
    rule = spec.get("assign") or "blocks"
    return out, rule


def data_spec_dict(cfg: DictConfig) -> dict[str, Any]:
    """The DataSpec fields (federated_data.DataSpec) from the composed config."""
    ds, part = cfg.dataset, cfg.partition
    return {
        "dataset": ds.name,
        "root": ds.get("root"),
        "options": _plain(ds.get("options")) or {},
        "partitioner": part.name,
        "num_clients": int(cfg.num_clients),
        "alpha": float(part.get("alpha", cfg.alpha)),
        "min_size": int(part.get("min_size", 40)),
        "self_balancing": bool(part.get("self_balancing", True)),
        "shards_per_client": int(part.get("shards_per_client", 2)),
        "partition_path": str(part.path) if part.get("path") else None,
        "test_fraction": float(cfg.test_fraction),
        "pool_splits": bool(ds.get("pool_splits", True)),
        "public": str(ds.get("public", "none")),
        "public_fraction": float(ds.get("public_fraction", 0.1)),
        "transfer_fraction": float(ds.get("transfer_fraction", 0.0)),
        "subsample": float(ds.get("subsample", 1.0)),
        "seed": int(cfg.seed),
    }


def client_spec_fields(
    cfg: DictConfig, *, data: dict[str, Any] | None = None, models: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The part of the client spec the config decides (all but the run's token and folders:
    :func:`strategies.base.client_spec.for_run` adds those); resolved once, in the run's plan."""
    from pflower.strategies.base.client_spec import client_spec as spec_of

    checkpoint_every = int(cfg.get("checkpoint_every", 1))
    return {
        **spec_of(
            lr=float(cfg.lr),
            local_epochs=int(cfg.local_epochs),
            batch_size=int(cfg.batch_size),
            momentum=float(cfg.momentum),
            weight_decay=float(cfg.weight_decay),
            optimizer=str(cfg.get("optimizer", "sgd")),
            optimizer_state=str(cfg.get("optimizer_state", "fresh")),
            local_steps=None if cfg.get("local_steps") is None else int(cfg.local_steps),
            seed=int(cfg.seed),
            device=str(cfg.device),
            run="",  # the run's token: for_run
            # saves each client keeps: a server crash replays at most checkpoint_every rounds
            state_versions=checkpoint_every + 1 if checkpoint_every > 0 else 1,
            deterministic=bool(cfg.get("deterministic", False)),
            data=data_spec_dict(cfg) if data is None else data,
        ),
        # server-side only (the strategy takes them out): the per-round learning rate, and for a
        # heterogeneous federation the architectures and who runs which
        "lr_schedule": {**(_plain(cfg.get("lr_schedule")) or {}), "rounds": int(cfg.rounds)},
        "server_store": {"mode": str(cfg.get("server_store", "auto"))},
        **(model_entries(cfg) if models is None else models),
    }


def model_entries(cfg: DictConfig, archs: tuple[dict[str, dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    """The client spec's model keys: the model, and for a mixed federation every architecture and
    the assignment rule (``archs``: :func:`model_archs` of ``cfg`` when already resolved)."""
    archs, rule = model_archs(cfg) if archs is None else archs
    if model_spec(cfg).get("name") != MIXED:
        return {"model": model_spec(cfg)}
    return {"model": next(iter(archs.values())), "archs": archs, "assign": rule}
