#!/usr/bin/env python3
"""Write each client's partition of a supported dataset into its own node directory.

For demos and tests of a real deployment: each SuperNode then reads only its directory
(``--node-config "client-id=<i> data-dir='<out>/client_<i>'"``) and the server runs with
``dataset=local``. The split is exactly the one `pflower sim` / `flwr run` simulation gives
with the same settings (same composition of conf/, same seed), and meta.json carries the
pooled dataset's normalization, so node i's tensors equal simulated client i's.

    python scripts/export_partitions.py --out data num_clients=3 dataset=digits alpha=1.0
    python scripts/export_partitions.py --out data experiment=smoke dataset=fmnist

Arguments after the options are hydra overrides, as for `pflower sim`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # runnable from a source checkout without installing
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from pflower.federated_data.export import export_partitions
    from pflower.server_app.config import ConfigError
    from pflower.server_app.run_plan import plan_run

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory to write client_<id>/ directories into")
    parser.add_argument("--clients", type=int, nargs="*", help="only these client ids (default: all)")
    parser.add_argument("overrides", nargs="*", help="hydra overrides (num_clients=3 dataset=digits alpha=1.0 ...)")
    args = parser.parse_args(argv)
    try:
        spec = plan_run(args.overrides).data
        paths = export_partitions(spec, Path(args.out), args.clients)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    info = spec.info
    for p in paths:
        print(p)
    c, s, _ = info.in_shape
    print(
        f"\n{len(paths)} node directories for {spec.dataset} ({spec.partitioner}, {spec.num_clients} clients). "
        f"Run the server with:\n  --run-config \"dataset='local' num_clients={spec.num_clients}"
        + (
            ""
            if (c, s, info.num_classes) == (1, 28, 10)
            else f" overrides='dataset.options.channels={c} dataset.options.image_size={s} "
            f"dataset.options.num_classes={info.num_classes}'"
        )
        + '"'
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
