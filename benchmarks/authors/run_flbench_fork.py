"""Run an FL-bench fork's server script and write its per-round accuracies, without editing it.

    cd <code>/src/server && python /path/to/run_flbench_fork.py fedsper.py FedSoftPerServer out.csv -- <its args>

The FedCPMD authors' code as committed cannot write its metrics (``src/server/fedavg_V1.py``
reads ``self.metrics1``, set only in commented-out code, and stops): this runs the script's
server class with ``--save_metrics 0`` and writes ``server.metrics`` (``test_before`` and
``test_after`` per round, in percent) as the code's own ``*_acc_metrics.csv`` would have been.
"""

from __future__ import annotations

import csv
import runpy
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    if len(argv) < 3 or "--" not in argv:
        raise SystemExit(__doc__)
    script, cls, out = argv[0], argv[1], Path(argv[2])
    sys.argv = [script, *argv[argv.index("--") + 1 :], "--save_metrics", "0"]
    sys.path.insert(0, str(Path(script).resolve().parent))
    server = runpy.run_path(script, run_name="flbench_fork")[cls]()
    server.run()
    columns = [k for k in ("test_before", "test_after") if server.metrics.get(k)]
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(zip(*(server.metrics[k] for k in columns)))
    print(f"{out}: {len(server.metrics[columns[0]])} rounds")


if __name__ == "__main__":
    main(sys.argv[1:])
