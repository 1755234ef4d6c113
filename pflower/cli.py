"""The ``pflower`` command: one entry that hands each subcommand to the part that does it
(``sim``: :mod:`pflower.simulation`; ``run`` and ``superlink``: :mod:`pflower.server_app`;
``report``, ``leaderboard``, ``claims`` and ``methods``: :mod:`pflower.reports`). Each part is
imported only when its command runs, so ``pflower superlink status`` never loads torch.
"""

from __future__ import annotations

import sys

USAGE = """usage: pflower sim [-m] [key=value ...]
       pflower report [--out DIR] [--smooth N] RUN_DIR_OR_PARENT...
                                  (Markdown table of finished runs vs the papers; with --out
                                   also DIR/report.md and accuracy-vs-round/-MiB plots)
       pflower leaderboard status|run|write [PROTOCOL ...]
                                  (every method on the shared protocols of conf/leaderboard.yaml,
                                   several seeds: run what is missing, write docs/leaderboard.md)
       pflower claims write|check|unread (the papers' claims beside the committed runs: docs/claims.md)
       pflower methods [NAME ...]       (the methods; a method's options: type, default, allowed, doc)
       pflower run [flwr run options]   (`flwr run . --stream` through this checkout's own local
                                   SuperLink; exits with the run's status)
       pflower superlink status|stop [--all]
                                  (the local SuperLink `flwr run .` uses from this shell:
                                   its ports and working directory; stop only that one)

  pflower sim method=fedavg dataset=fmnist alpha=0.1 rounds=50
  pflower sim -m method=fedavg,fedper,local          (one run per value: a sweep)
  pflower sim -m seed=1,2,3,4 --jobs 2                (a sweep, two runs at a time)
  pflower sim experiment=smoke                        (a conf/experiment/ file)
  pflower sim resume=outputs/<date>/<run> rounds=60   (continue a run after its last checkpoint)
Keys: see conf/config.yaml; groups: method, dataset, model, partition, experiment."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "sim":
        from pflower.simulation.sim_command import sim_main

        return sim_main(rest)
    if command == "superlink":
        from pflower.server_app.superlink import main as superlink_main

        return superlink_main(rest)
    if command == "run":
        from pflower.server_app.superlink import run_main

        return run_main(rest)
    if command == "report":
        from pflower.reports.report import main as report_main

        return report_main(rest)
    if command == "methods":
        from pflower.reports.methods_cli import main as methods_main

        return methods_main(rest)
    if command == "leaderboard":
        from pflower.reports.leaderboard import main as leaderboard_main

        return leaderboard_main(rest)
    if command == "claims":
        from pflower.reports.claims import main as claims_main

        return claims_main(rest)
    print(f"pflower: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
