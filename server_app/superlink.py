"""``pflower superlink status|stop``: the local SuperLink that `flwr run .` starts, and only yours.

`flwr run .` starts a detached ``flower-superlink`` (HTTP API on ``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``,
default 39091; Control API on ``FLWR_LOCAL_CONTROL_API_PORT``, default 39093; state and log under
``$FLWR_HOME/local-superlink``) that outlives the command and keeps the working directory and
Python environment it was started from: a relative ``output_dir`` lands there. These commands find
this folder's SuperLinks (the shell's ``FLWR_HOME`` and ports when started here, and the one
``pflower run`` gives this checkout), owned by this user, so other users' and other clones'
SuperLinks are never touched unless named (``--pid``, ``--all``), unlike ``pkill -f flower-superlink``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .interrupt import (
    EXIT_INTERRUPTED,
    RunInterrupted,
    checkpointed_round,
    ctrl_c_stops_the_run,
    descendants,
    end_processes,
    interrupted_line,
)
from .provenance import code_files


@dataclass(frozen=True)
class LocalSuperLink:
    pid: int
    http_port: str
    control_port: str
    flwr_home: Path | None
    cwd: Path | None


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


def local_superlinks() -> list[LocalSuperLink]:
    """Every local SuperLink (the simulation-mode ``flower-superlink`` that `flwr run` starts) of this user."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.parent.stat().st_uid != os.getuid():
                continue
            args = [a.decode(errors="replace") for a in cmdline.read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if not args or not any(Path(a).name == "flower-superlink" for a in args[:2]) or "--simulation" not in args:
            continue
        control = _arg(args, "--control-api-address") or ""
        log_file = _arg(args, "--log-file")
        try:
            cwd: Path | None = (cmdline.parent / "cwd").resolve(strict=True)
        except OSError:
            cwd = None
        found.append(
            LocalSuperLink(
                pid=int(cmdline.parent.name),
                http_port=_arg(args, "--port") or "?",
                control_port=control.rsplit(":", 1)[-1],
                flwr_home=Path(log_file).parent.parent if log_file else None,
                cwd=cwd,
            )
        )
    return sorted(found, key=lambda s: s.pid)


def flwr_home() -> Path:
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr").expanduser().resolve()


def control_port() -> str:
    return os.environ.get("FLWR_LOCAL_CONTROL_API_PORT", "39093")


def mine(superlinks: list[LocalSuperLink], home: Path | None = None, port: str | None = None) -> list[LocalSuperLink]:
    """The SuperLinks of this ``FLWR_HOME`` and Control API port (the one `flwr run .` here would use)."""
    home, port = home or flwr_home(), port or control_port()
    return [s for s in superlinks if s.control_port == port and (s.flwr_home is None or s.flwr_home.resolve() == home)]


def stop(superlink: LocalSuperLink, wait_s: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``wait_s``; True when the process is gone."""
    try:
        os.kill(superlink.pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not Path(f"/proc/{superlink.pid}").exists() or _zombie(superlink.pid):
                return True
            time.sleep(0.2)
        os.kill(superlink.pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return True
    except PermissionError:
        return False


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def describe(s: LocalSuperLink) -> str:
    return (
        f"pid {s.pid}: HTTP API 127.0.0.1:{s.http_port}, Control API 127.0.0.1:{s.control_port}, "
        f"FLWR_HOME {s.flwr_home or '?'}, working directory {s.cwd or '?'} (a relative output_dir lands there)"
    )


USAGE = """usage: pflower superlink status|stop [--pid N | --all]
  status        this folder's local SuperLinks (the one `flwr run .` uses from this shell, when it was
                started here, and the one `pflower run` gives this checkout), then your others
  stop          stop this folder's SuperLinks only; another checkout's or shell's keep running
  stop --pid N  stop one of your local SuperLinks by its pid (as `status` lists it)
  stop --all    stop every local SuperLink of yours, other checkouts' and shells' too"""


def own(superlinks: list[LocalSuperLink], folder: Path | None = None) -> list[LocalSuperLink]:
    """This folder's SuperLinks: the shell's (this ``FLWR_HOME`` and Control API port) when it was
    started from ``folder``, and the one `pflower run` gives ``folder`` (its FLWR_HOME under
    :func:`checkout_home`). A SuperLink another checkout started is never among them, even under
    the shell's ``FLWR_HOME``: stopping it would end that checkout's runs."""
    folder = (folder or Path.cwd()).resolve()
    home = checkout_home(folder)
    shells = [s for s in mine(superlinks) if s.cwd is not None and s.cwd.resolve() == folder]
    runs = [s for s in superlinks if s.flwr_home is not None and s.flwr_home.resolve() == home]
    return sorted(set(shells) | set(runs), key=lambda s: s.pid)


def _print_status(folder: Path, ours: list[LocalSuperLink], others: list[LocalSuperLink]) -> None:
    """``pflower superlink status``: this folder's local SuperLinks, then the user's others."""
    if not ours:
        print(f"no local SuperLink of {folder}: `flwr run .` or `pflower run` will start one")
    for s in ours:
        print(f"local SuperLink of {folder}:\n  {describe(s)}")
    if others:
        print("your other local SuperLinks (other checkouts or shells; `pflower superlink stop --pid N` stops one):")
        for s in others:
            print(f"  {describe(s)}")


def main(argv: list[str]) -> int:
    pid = argv[2] if len(argv) == 3 and argv[:2] == ["stop", "--pid"] else None
    if argv not in (["status"], ["stop"], ["stop", "--all"]) and not (pid and pid.isdigit()):
        print(USAGE)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    every = local_superlinks()
    folder = Path.cwd().resolve()
    if argv == ["stop", "--all"]:
        ours = every
    elif pid is not None:
        ours = [s for s in every if s.pid == int(pid)]
        if not ours:
            print(f"pflower: no local SuperLink of yours has pid {pid}; `pflower superlink status` lists them")
            return 2
    else:
        ours = own(every, folder)
    if argv[0] == "status":
        _print_status(folder, ours, [s for s in every if s not in ours])
        return 0
    if not ours:
        print(f"no local SuperLink of {folder}: nothing to stop")
    failed = [s for s in ours if not stop(s)]
    for s in ours:
        print(f"{'could not stop' if s in failed else 'stopped'} the local SuperLink {describe(s)}")
    kept = [s for s in mine(every) if s not in ours and argv == ["stop"]]
    for s in kept:
        print(
            f"left running: the SuperLink of this shell's FLWR_HOME, started from {s.cwd or '?'} (another checkout's "
            f"runs use it); `pflower superlink stop --pid {s.pid}` stops it"
        )
    return 1 if failed else 0


# ----------------------------------------------------------------------------- one checkout, one SuperLink


# the folders and files whose contents decide what a run computes (provenance.CODE_PATHS plus the data code)
def is_checkout(path: Path) -> bool:
    """A pflower source tree: its pyproject names the project and it has the code folders."""
    try:
        text = (path / "pyproject.toml").read_text()
    except OSError:
        return False
    return 'name = "pflower"' in text and all((path / d).is_dir() for d in ("server_app", "strategies"))


def differing_code(app_dir: Path, other: Path) -> list[str]:
    """The code files in which the app that runs (``app_dir``, the unpacked FAB) and the
    checkout ``other`` differ, either way; empty when they hold the same code."""
    mine, theirs = code_files(app_dir), code_files(other)
    return sorted(p for p in set(mine) | set(theirs) if mine.get(p) != theirs.get(p))


def check_superlink_checkout(app_dir: Path, superlink_cwd: Path) -> None:
    """Refuse a run whose code is not the code of the checkout the local SuperLink was started in.

    `flwr run .` reuses the detached SuperLink that a first `flwr run .` started, with that
    checkout's Python environment and working directory: a second checkout's run then imports the
    packages installed for the first (torch, flwr and, under an editable install, whatever the
    first checkout's environment resolves) and writes a relative output_dir into the first. The
    unpacked FAB and the SuperLink's working directory tell: where both are pflower trees and
    their code differs, the run stops with the fix."""
    if not is_checkout(superlink_cwd) or app_dir.resolve() == superlink_cwd.resolve():
        return
    differ = differing_code(app_dir, superlink_cwd)
    if differ:
        from .config import ConfigError

        shown = ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
        raise ConfigError(
            f"this local SuperLink was started from another checkout ({superlink_cwd}, its Python {sys.executable}), "
            f"whose code differs from the app you ran ({shown}); it would run your code with that checkout's "
            "environment and working directory. Use `pflower run`, which gives each checkout a SuperLink of its own, "
            "or stop that one (`pflower superlink status` names its pid, `pflower superlink stop --pid N` stops it) "
            "and run again"
        )


def checkout_home(checkout: Path) -> Path:
    """The FLWR_HOME `pflower run` gives a checkout: ~/.cache/pflower/superlinks/<sha of its path>."""
    digest = hashlib.sha256(str(checkout.resolve()).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return (cache / "pflower" / "superlinks" / digest).resolve()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def checkout_env(checkout: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment `pflower run` runs `flwr run` in: this checkout's FLWR_HOME and ports (kept in
    ``<home>/ports.json`` and reused while its SuperLink runs; two free ports otherwise), and this
    Python environment's bin on PATH."""
    env = dict(os.environ if base is None else base)
    home = checkout_home(checkout)
    home.mkdir(parents=True, exist_ok=True)
    ports_file = home / "ports.json"
    try:
        ports = json.loads(ports_file.read_text())
        http, control = str(int(ports["http"])), str(int(ports["control"]))
    except (OSError, ValueError, KeyError, TypeError):
        http = control = ""
    running = [s for s in local_superlinks() if s.flwr_home is not None and s.flwr_home.resolve() == home]
    if not (running and running[0].control_port == control):
        http, control = str(_free_port()), str(_free_port())
        while control == http:
            control = str(_free_port())
        ports_file.write_text(
            json.dumps({"http": int(http), "control": int(control), "checkout": str(checkout.resolve())})
        )
    env.update(
        {
            "FLWR_HOME": str(home),
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": http,
            "FLWR_LOCAL_CONTROL_API_PORT": control,
        }
    )
    return with_this_python(env)


def with_this_python(env: dict[str, str]) -> dict[str, str]:
    """``env`` for ``flwr run``: no run-time dependency installation unless the user asked for it,
    and this Python environment's bin on PATH. Flower starts `flower-superlink` by name: found in
    this environment's bin even when it is not activated (`.venv/bin/pflower run`); appended, so a
    PATH the user set still comes first."""
    env.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    here = str(Path(sys.executable).parent)
    if here not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = os.pathsep.join(p for p in (env.get("PATH", ""), here) if p)
    return env


STARTED = re.compile(r"Successfully started run (\d+)")
# `flwr`, with a FAB build that does not walk the checkout's ignored folders (its .venv: 5.8 s; flwr_cli.py)
FLWR = [sys.executable, "-m", "pflower.server_app.flwr_cli"]


def unusable_state(database: Path) -> str | None:
    """Why the local SuperLink could not start from ``database`` (its SQLite state), or None.

    A ``flower-superlink`` killed while it migrated its state leaves Alembic's temporary tables
    behind (``_alembic_tmp_run``); every later start then fails on them ("exited with code 1"). A
    file that is not a readable SQLite database fails the same way."""
    import sqlite3

    if not database.is_file():
        return None
    try:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc) or "malformed" in str(exc):
            return f"it is not a readable SQLite database ({exc})"
        return None  # busy, locked, no access: Flower's own start says what is wrong
    leftover = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if leftover:
        return f"a start that was stopped while it migrated the state left {', '.join(leftover)} behind"
    return None


def recover_state(home: Path, now: float | None = None) -> str | None:
    """Keep an unusable local SuperLink state aside (``state.db.unusable-<time>``, with its -wal and
    -shm files) so the next start begins a fresh one; the line to say, or None when it was fine.
    Only for this checkout's own FLWR_HOME, and only while no SuperLink of it runs."""
    database = home / "local-superlink" / "state.db"
    why = unusable_state(database)
    if why is None:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    kept = database.with_name(f"state.db.unusable-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        part = database.with_name(database.name + suffix)
        if part.exists():
            part.rename(kept.with_name(kept.name + suffix))
    return (
        f"pflower run: this checkout's local SuperLink state {database} could not be used ({why}); "
        f"kept aside as {kept}, starting with a fresh one (the earlier runs' records are in the kept file)"
    )


def run_status(run_id: str, env: dict[str, str], cwd: Path) -> str:
    """The run's status as `flwr ls` reports it (``finished:completed``, ``finished:failed``...)."""
    listed = subprocess.run(
        ["flwr", "ls", "--run-id", run_id, "--format", "json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        runs = json.loads(listed.stdout).get("runs") or []
        return str(runs[0]["status"])
    except (ValueError, IndexError, KeyError, AttributeError):
        return f"unknown (flwr ls: {(listed.stdout + listed.stderr).strip()[:200]})"


RUN_USAGE = """usage: pflower run [flwr run options ...]
  `flwr run . --stream` from this checkout, exiting with the run's status: 0 when the run completed,
  1 when it failed or was stopped (`flwr run --stream` exits 0 either way), 2 for a bad setting or
  missing data (checked before anything starts), 130 after Ctrl-C (the run stopped on the SuperLink,
  its processes ended, its checkpoint kept; the line printed says how to continue).
  With FLWR_HOME set: that FLWR_HOME's local SuperLink and config.toml, as `flwr run .` uses them.
  Without: a local SuperLink of this checkout's own (FLWR_HOME under ~/.cache/pflower/superlinks/,
  its own ports). Without --federation-config "num-supernodes=N", N is the run's num_clients (a
  config.toml's num-supernodes is kept when it equals num_clients; otherwise a line says why not).
  The SuperLink stays up for the next run; `pflower superlink stop` (in this folder) stops it.
  e.g. pflower run --run-config "method='fedper' rounds=5" --federation-config "num-supernodes=20" """


def _option_values(argv: list[str], *names: str) -> list[str]:
    """The values of a repeatable option (``--run-config X``, ``--run-config=X``, ``-c X``)."""
    out = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in names:
            if eq:
                out.append(value)
            elif i + 1 < len(argv):
                out.append(argv[i + 1])
    return out


def user_federation(home: Path) -> tuple[dict[str, object], str]:
    """The simulation options of the default SuperLink connection in ``<home>/config.toml`` (Flower's
    own configuration: ``[superlink.<name>.options]``, with ``num-supernodes`` and
    ``backend.client-resources.num-cpus``), flattened, and where they were read; empty when the file
    or the options are absent."""
    import tomllib

    path = home / "config.toml"
    try:
        toml = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}, str(path)
    links = toml.get("superlink") if isinstance(toml.get("superlink"), dict) else {}
    name = links.get("default")
    options = links.get(name, {}).get("options", {}) if isinstance(links.get(name), dict) else {}
    if not isinstance(options, dict):
        return {}, str(path)
    resources = (
        options.get("backend", {}).get("client-resources", {}) if isinstance(options.get("backend"), dict) else {}
    )
    flat: dict[str, object] = {}
    if "num-supernodes" in options:
        flat["num-supernodes"] = options["num-supernodes"]
    if isinstance(resources, dict) and "num-cpus" in resources:
        flat["client-resources-num-cpus"] = resources["num-cpus"]
    return flat, f"{path}, connection {name!r}"


def checked_flwr_args(argv: list[str], checkout: Path, home: Path | None = None) -> tuple[list[str], list[str]]:
    """``flwr run``'s options, checked and completed before anything starts, and the lines to say.

    The run config (``pyproject``'s ``[tool.flwr.app.config]`` with the ``--run-config`` values) is
    composed and its strategy built here, as the ServerApp would, and its data partition made, so a
    bad key or value, a missing data folder or more clients than the data holds fails in seconds
    with one line and exit status 2 instead of after a SuperLink start (``ValueError``).

    Without ``num-supernodes`` in ``--federation-config``, the federation's SuperNodes are the run's
    ``num_clients`` (with ``client-resources-num-cpus=1``: two clients train at once on 2 cores),
    so the default run needs no options. Where the Flower configuration of ``home`` (the user's
    ``$FLWR_HOME/config.toml``) sets them, its values are kept when they fit the run; a
    ``num-supernodes`` that differs from ``num_clients`` (one SuperNode per client: the ServerApp
    refuses any other count) is replaced, and a line says so. Checked only where this pflower's
    own ``conf/`` is the checkout's."""
    import tomllib

    from pflower.compat import parse_run_config
    from pflower.conf import __file__ as conf_init

    from .config import overrides_from_run_config
    from .run_plan import plan_run
    from .runner import check_data, check_strategy

    if Path(conf_init).resolve().parent != (checkout / "conf").resolve():
        return argv, []  # another checkout's code: its own ServerApp checks it
    try:
        declared = tomllib.loads((checkout / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
        given = parse_run_config(_option_values(argv, "--run-config", "-c"))
    except (KeyError, OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"pyproject.toml's [tool.flwr.app.config] cannot be read ({exc})") from exc
    plan = plan_run(overrides_from_run_config({**declared, **given}))
    check_strategy(plan)
    if not plan.run.resume:
        check_data(plan)  # the data folder and the partition, as `pflower sim` checks them
    said: list[str] = []
    federation = " ".join(_option_values(argv, "--federation-config"))
    if "num-supernodes" not in federation:
        theirs, where = user_federation(home) if home is not None else ({}, "")
        clients = plan.run.num_clients
        extra = []
        if theirs.get("num-supernodes") != clients:
            extra.append(f"num-supernodes={clients}")
            if "num-supernodes" in theirs:
                said.append(
                    f"pflower run: {clients} SuperNodes (the run's num_clients), not the {theirs['num-supernodes']} "
                    f"of {where}: each client is one SuperNode; set num_clients={theirs['num-supernodes']} "
                    "to run on yours"
                )
        if "client-resources-num-cpus" not in federation and "client-resources-num-cpus" not in theirs:
            extra.append("client-resources-num-cpus=1")
        if extra:
            argv += ["--federation-config", " ".join(extra)]
    return argv, said


def users_superlink(checkout: Path, base: dict[str, str]) -> tuple[Path | None, LocalSuperLink | None]:
    """The ``FLWR_HOME`` the user set, if ``pflower run`` is to use it, and else the running local
    SuperLink of that home that another checkout started (it would run this checkout's code with the
    other's environment); (None, None) without one. Reads processes only: nothing is written."""
    if not base.get("FLWR_HOME"):
        return None, None
    users = Path(base["FLWR_HOME"]).expanduser().resolve()
    port = base.get("FLWR_LOCAL_CONTROL_API_PORT", "39093")
    theirs = [s for s in mine(local_superlinks(), users, port) if s.cwd is not None and s.cwd.resolve() != checkout]
    return (None, theirs[0]) if theirs else (users, None)


def run_env(checkout: Path, base: dict[str, str] | None = None) -> tuple[dict[str, str], str | None]:
    """The environment ``pflower run`` runs ``flwr run`` in, and the line that says which SuperLink.

    A ``FLWR_HOME`` the user set is theirs to keep: its local SuperLink and ``config.toml`` are used
    as ``flwr run .`` would (with the ``FLWR_LOCAL_*`` ports the environment gives, or Flower's
    defaults), unless its running SuperLink was started from another checkout: then, as without
    one, the checkout gets a SuperLink of its own (:func:`checkout_env`), so two checkouts never run
    each other's code."""
    base = dict(os.environ if base is None else base)
    users, foreign = users_superlink(checkout, base)
    if users is None:
        env = checkout_env(checkout, base)
        if foreign is None:
            return env, None
        return env, (
            f"pflower run: the local SuperLink of your FLWR_HOME={Path(base['FLWR_HOME']).expanduser().resolve()} "
            f"was started from another checkout ({foreign.cwd}); this checkout's run goes through one of its own "
            f"(FLWR_HOME {env['FLWR_HOME']})"
        )
    env = with_this_python(dict(base))
    return env, (
        f"pflower run: your FLWR_HOME={users} and its local SuperLink (HTTP API port "
        f"{env.get('FLWR_LOCAL_SUPERLINK_HTTP_API_PORT', '39091')}); without FLWR_HOME this checkout gets its own"
    )


def run_main(argv: list[str], checkout: Path | None = None) -> int:
    """``pflower run``: see :data:`RUN_USAGE`."""
    if argv and argv[0] in ("-h", "--help"):
        print(RUN_USAGE)
        return 0
    checkout = (checkout or Path.cwd()).resolve()
    if not (checkout / "pyproject.toml").exists():
        print(
            f"pflower run: {checkout} has no pyproject.toml: run it in the Flower app's folder (the pflower checkout)",
            file=sys.stderr,
        )
        return 2
    from .failures import USER_ERRORS

    users, _ = users_superlink(checkout, dict(os.environ))  # the home whose config.toml flwr will read
    try:  # nothing is written or started before this check
        argv, said = checked_flwr_args(list(argv), checkout, users or checkout_home(checkout))
    except (ValueError, *USER_ERRORS) as exc:  # a bad key or value: one line, before any SuperLink or run starts
        print(f"pflower: {exc}", file=sys.stderr)
        return 2
    env, which = run_env(checkout)
    home = Path(env["FLWR_HOME"]).expanduser().resolve()
    for line in [which, *said]:
        if line:
            print(line, file=sys.stderr)
    running = any(s.flwr_home is not None and s.flwr_home.resolve() == home for s in local_superlinks())
    if home == checkout_home(checkout) and not running:  # only this checkout's own home is pflower's to repair
        recovered = recover_state(home)
        if recovered:
            print(recovered, file=sys.stderr)
    if "--stream" not in argv:
        argv.append("--stream")
    seen: dict[str, str] = {}
    proc: subprocess.Popen | None = None
    with ctrl_c_stops_the_run():
        try:
            # its own session: a Ctrl-C is this process's to handle (flwr run's own would only
            # stop the stream, with a traceback, and leave the run going)
            with subprocess.Popen(
                [*FLWR, "run", ".", *argv],
                cwd=checkout,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                start_new_session=True,
            ) as proc:
                assert proc.stdout is not None
                for line in proc.stdout:
                    sys.stdout.write(line)
                    for key, pattern in (("run_id", STARTED), ("run_dir", RUN_DIR)):
                        found = pattern.search(line)
                        if found and key not in seen:
                            seen[key] = found.group(1)
                code = proc.wait()
        except KeyboardInterrupt:
            return stop_interrupted_run(seen, proc, env, checkout)
    run_id = seen.get("run_id")
    if run_id is None:
        log = home / "local-superlink" / "superlink.log"
        print(
            f"pflower run: `flwr run` started no run (exit status {code}); if its local SuperLink did not start, "
            f"its log is {log} and `pflower superlink status` shows what runs",
            file=sys.stderr,
        )
        return code or 1
    status = run_status(run_id, env, checkout)
    ok = status == "finished:completed"
    print(
        f"pflower run: run {run_id} {status}; this checkout's SuperLink stays up (`pflower superlink stop` stops it)",
        file=sys.stdout if ok else sys.stderr,
    )
    return 0 if ok else 1


RUN_DIR = re.compile(r"pflower run directory: (\S+)")


def stop_interrupted_run(
    seen: dict[str, str], proc: subprocess.Popen | None, env: dict[str, str], checkout: Path
) -> int:
    """Ctrl-C under ``pflower run``: stop the run on the SuperLink (``flwr stop``), end the stream
    and every process the run started (its ``flwr-simulation`` and Ray's), say how to continue from
    the last checkpoint; 130. The SuperLink itself stays up for the next run, as after any run."""
    home = Path(env["FLWR_HOME"]).resolve()
    link = [s for s in local_superlinks() if s.flwr_home is not None and s.flwr_home.resolve() == home]
    superexecs = [p for s in link for p in descendants(s.pid) if "flower-superexec" in _cmdline(p)]
    # the run's processes, found before the stop: Ray's agents are re-parented to init as it ends
    run_procs = [p for s in link for p in descendants(s.pid) if p not in superexecs]
    run_id = seen.get("run_id")
    if run_id is not None:
        stopped = subprocess.run(
            [*FLWR, "stop", run_id], cwd=checkout, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        if stopped.returncode != 0:
            print(f"pflower run: `flwr stop {run_id}` failed: {(stopped.stdout + stopped.stderr).strip()[-300:]}")
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
    end_processes(run_procs, grace_s=2.0)  # stopped on the SuperLink: nothing of theirs is still needed
    if run_id is None:
        print("pflower: stopped by Ctrl-C before the run started; nothing was written")
        return EXIT_INTERRUPTED
    run_dir = Path(seen["run_dir"]) if "run_dir" in seen else None
    kept = run_dir if run_dir is not None and run_dir.is_dir() else None
    exc = RunInterrupted(kept, checkpointed_round(kept) if kept else None)
    resume = "pflower run --run-config \"resume='{run_dir}'\""
    print(f"{interrupted_line(exc, resume)} (run {run_id} stopped on the SuperLink)")
    return EXIT_INTERRUPTED


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
