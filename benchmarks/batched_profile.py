"""``python -m benchmarks.batched_profile``: where a client-step's time goes, one client at a time
against the batched engine's one computation, on this machine's CPU (or ``--device cuda``).

Ten LeNet-5 clients of 640 FMNIST-shaped samples each train one epoch of batch 32 (20 steps
each), first one after the other (``client_app.training.train``, what the serial and parallel
engines run), then together (``client_app.grouped_training.train_together``, the batched engine). Prints
milliseconds per client-step (median of ``--repeats``) and, from ``torch.profiler``, the
operators that take the time in each. Then the same clients' evaluation on a test split of
``--test-samples`` each: one model at a time (``client_app.training.evaluate``) against
together (``client_app.grouped_training.evaluate_together``, what ``batch_eval`` turns on), in
milliseconds per client.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from statistics import median

import torch

from benchmarks.common import markdown_table, publish, run_header
from pflower.client_app.grouped_training import evaluate_together, train_together
from pflower.client_app.roles.base import FitPlan
from pflower.client_app.training import TrainArgs, evaluate, train
from pflower.models import build_model


def workload(clients: int, samples: int, device: torch.device):  # noqa: ANN201
    g = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(samples, 1, 28, 28, generator=g), torch.randint(0, 10, (samples,), generator=g))
        for _ in range(clients)
    ]
    model = build_model("lenet5", (1, 28, 28), 10, seed=1).to(device)
    return model, [(x.to(device), y.to(device)) for x, y in data]


def one_at_a_time(model, data, args, device) -> None:  # noqa: ANN001
    for k, (x, y) in enumerate(data):
        train(copy.deepcopy(model), x, y, args, generator=torch.Generator().manual_seed(k), device=device)


def together(model, data, args, device) -> None:  # noqa: ANN001
    models = [copy.deepcopy(model) for _ in data]
    gens = [torch.Generator().manual_seed(k) for k in range(len(data))]
    train_together(models, data, [FitPlan() for _ in data], args, gens, device)


def evaluation_rows(model, clients: int, samples: int, repeats: int, device: torch.device) -> list[dict]:  # noqa: ANN001
    """ms per client of evaluating ``clients`` models (perturbed copies) one at a time and together."""
    _, tests = workload(clients, samples, device)
    models = []
    for k in range(clients):
        m = copy.deepcopy(model)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(k)).to(device))
        models.append(m)
    ways = {
        "one model at a time": lambda: [evaluate(m, x, y, device=device) for m, (x, y) in zip(models, tests)],
        "together (vmap)": lambda: evaluate_together(models, tests, device),
    }
    rows = []
    for name, run in ways.items():
        run()  # warm-up
        times = []
        for _ in range(repeats):
            sync(device)
            t0 = time.perf_counter()
            run()
            sync(device)
            times.append(time.perf_counter() - t0)
        rows.append({"evaluation": name, "ms per client (median)": f"{1000 * median(times) / clients:.2f}"})
    return rows


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--samples", type=int, default=640)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--test-samples", type=int, default=128, help="each client's test split (evaluation)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="benchmarks/results/batched_profile.md", help="'' = print only")
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, data = workload(args.clients, args.samples, device)
    train_args = TrainArgs(epochs=1, batch_size=32, lr=0.01)
    steps = args.clients * (args.samples // 32)
    ways = {"one client at a time": one_at_a_time, "batched (vmap)": together}
    rows, profiles = [], []
    for name, run in ways.items():
        run(model, data, train_args, device)  # warm-up
        times = []
        for _ in range(args.repeats):
            sync(device)
            t0 = time.perf_counter()
            run(model, data, train_args, device)
            sync(device)
            times.append(time.perf_counter() - t0)
        rows.append({"way": name, "ms per client-step (median)": f"{1000 * median(times) / steps:.2f}"})
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            run(model, data, train_args, device)
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        top = sorted(prof.key_averages(), key=lambda e: getattr(e, sort, 0), reverse=True)
        total = sum(getattr(e, sort) for e in prof.key_averages()) or 1
        profiles.append(
            markdown_table(
                [
                    {
                        "operator": e.key,
                        "ms per client-step": f"{getattr(e, sort) / 1000 / steps:.3f}",
                        "share": f"{100 * getattr(e, sort) / total:.1f} %",
                    }
                    for e in top[:10]
                ],
                ["operator", "ms per client-step", "share"],
            )
        )
    ratio = float(rows[1]["ms per client-step (median)"]) / float(rows[0]["ms per client-step (median)"])
    evals = evaluation_rows(model, args.clients, args.test_samples, args.repeats, device)
    eval_ratio = float(evals[1]["ms per client (median)"]) / float(evals[0]["ms per client (median)"])
    text = "\n\n".join(
        [
            run_header(
                f"python -m benchmarks.batched_profile {' '.join(sys.argv[1:] if argv is None else argv)}", t_start
            ),
            f"{args.clients} LeNet-5 clients x {args.samples} samples, one epoch of batch 32 ({steps} client-steps), "
            f"{args.threads} torch thread(s), device {device}.",
            markdown_table(rows, list(rows[0])),
            f"Batched / one at a time: **{ratio:.2f}x** the time per client-step.",
            "Operators, one client at a time (self time):",
            profiles[0],
            "Operators, batched:",
            profiles[1],
            f"Evaluation of the {args.clients} models, {args.test_samples} test samples each (eval mode):",
            markdown_table(evals, list(evals[0])),
            f"Together / one at a time: **{eval_ratio:.2f}x** the time per client.",
        ]
    )
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
