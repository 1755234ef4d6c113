"""An FL-bench ``partition.pkl`` (FL-bench and the codes forked from it: FedCMD, FedCPMD) as
pflower's ``partition=file`` JSON, so both codes train the very same clients.

    python -m benchmarks.authors.flbench_partition <code>/data/fmnist/partition.pkl partition.json
    pflower sim ... partition=file partition.path=partition.json

FL-bench pools the official train split, then the test split (``torch.cat``), as pflower does, so
the indices carry over unchanged. The file is a pickle: convert only files you made yourself.
"""

from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path
from typing import Any


def to_pflower(partition: dict[str, Any]) -> dict[str, Any]:
    """``{"data_indices": [{"train": [...], "test": [...]}, ...]}`` -> ``{"clients": [...]}``."""
    indices = partition.get("data_indices") if isinstance(partition, dict) else None
    if not isinstance(indices, list) or not indices:
        raise ValueError("not an FL-bench partition: expected a dict with a 'data_indices' list")
    return {
        "clients": [{"train": [int(i) for i in c["train"]], "test": [int(i) for i in c["test"]]} for c in indices],
        "source": "FL-bench partition.pkl",
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pkl", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    with args.pkl.open("rb") as f:
        converted = to_pflower(pickle.load(f))
    args.out.write_text(json.dumps(converted))
    print(f"{args.out}: {len(converted['clients'])} clients")


if __name__ == "__main__":
    main()
