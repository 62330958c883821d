"""Scaling of ppo_continuous_action_redis.py with the number of sampler processes, beside
ppo_continuous_action.py on the same environment and budget, and one multi-host run simulated on this
machine, measured in one run.

    python -m benchmark.redis_scaling                                 # Hopper-v4, 1, 2, 4 samplers
    python -m benchmark.redis_scaling --out benchmark/results/redis_samplers.md \\
        --plot benchmark/results/plots/redis_samplers.png

Each setting is a fresh run (OMP_NUM_THREADS=1, the scripts' defaults otherwise: 8 chunks of 256 steps,
a batch of 2,048 as ppo_continuous_action.py's 1 env x 2,048 steps) for `--iterations` iterations;
its numbers come from its TensorBoard log, medians over the iterations after the first:
- experience SPS: the learner's `charts/experience_SPS` (steps / time spent waiting for the chunks),
- learner SPS: `charts/learner_SPS` (steps / update time),
- end-to-end SPS: the script's own `charts/SPS` at the end,
- bytes per step through Redis (`charts/bytes_per_step`),
- the split of the time into `perf/rollout_time`, `perf/transfer_time`, `perf/update_time`,
  `perf/publish_time`.
The multi-host run starts a redis-server, the learner with `--redis-url ... --num-samplers 0`, and
each sampler as a separate `--role sampler` command, as they would be started on other machines.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmark.events import read_scalars
from benchmark.scripts import ROOT, child_env
from benchmark.shared_memory_scaling import later, report, run, time_split

SCRIPT = "ppo_continuous_action_redis"
BATCH = 2048


def summarize(scalars: dict) -> dict:
    return {
        "experience_sps": float(np.median(later(scalars, "charts/experience_SPS"))),
        "learner_sps": float(np.median(later(scalars, "charts/learner_SPS"))),
        "bytes_per_step": float(np.median(later(scalars, "charts/bytes_per_step"))),
        "sps": scalars["charts/SPS"][-1][1],
        "time_split": time_split(scalars),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def multi_host(env_id: str, iterations: int, samplers: int) -> dict:
    """A learner and `samplers` sampler commands started separately against a redis-server of their own."""
    port, run_id = free_port(), f"benchmark-{os.getpid()}"
    url = f"redis://127.0.0.1:{port}/0"
    server = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    processes = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            time.sleep(0.5)  # the server's start
            learner = subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / f"{SCRIPT}.py"),
                    "--env-id",
                    env_id,
                    "--redis-url",
                    url,
                    "--num-samplers",
                    "0",
                    "--run-id",
                    run_id,
                    "--total-timesteps",
                    str(iterations * BATCH),
                    "--runs-dir",
                    tmp,
                ],
                env=child_env(),
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
            )
            processes.append(learner)
            for _ in range(samplers):  # what another machine runs
                processes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(ROOT / f"{SCRIPT}.py"),
                            "--role",
                            "sampler",
                            "--redis-url",
                            url,
                            "--run-id",
                            run_id,
                        ],
                        env=child_env(),
                        cwd=ROOT,
                        stdout=subprocess.DEVNULL,
                    )
                )
            if learner.wait() != 0:
                raise RuntimeError("the multi-host learner failed")
            (run_dir,) = Path(tmp).iterdir()
            return summarize(read_scalars(run_dir))
    finally:
        for process in processes + [server]:
            process.terminate()
            process.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="Hopper-v4")
    parser.add_argument("--samplers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--iterations", type=int, default=6, help="iterations per run (the first is left out)")
    parser.add_argument("--out", default=None, help="also write the markdown to this file")
    parser.add_argument("--plot", default=None, help="write the PNG plot of SPS against samplers here")
    args = parser.parse_args()
    if args.iterations < 2:
        parser.error("--iterations must be at least 2 (the first is left out)")

    cores = os.cpu_count()
    rows = [
        "| run | samplers | experience SPS | speedup | learner SPS | end-to-end SPS | bytes/step | time split | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    points = []
    for samplers in args.samplers:
        result = summarize(run(SCRIPT, args.iterations, BATCH, "--env-id", args.env_id, "--num-samplers", samplers))
        points.append({"samplers": samplers, **result})
        note = (
            f"{samplers} samplers + learner + redis-server on {cores} cores: oversubscribed"
            if samplers + 1 > cores
            else ""
        )
        rows.append(
            f"| embedded server | {samplers} | {result['experience_sps']:,.0f} | "
            f"{result['experience_sps'] / points[0]['experience_sps']:.2f}x | {result['learner_sps']:,.0f} | "
            f"{result['sps']:,.0f} | {result['bytes_per_step']:,.0f} | {result['time_split']} | {note} |"
        )
        print(rows[-1], flush=True)
    remote = multi_host(args.env_id, args.iterations, 2)
    rows.append(
        f"| separate commands (multi-host, simulated) | 2 | {remote['experience_sps']:,.0f} | | "
        f"{remote['learner_sps']:,.0f} | {remote['sps']:,.0f} | {remote['bytes_per_step']:,.0f} | "
        f"{remote['time_split']} | server, learner and samplers started apart |"
    )
    print(rows[-1], flush=True)
    plain = run("ppo_continuous_action", args.iterations, BATCH, "--env-id", args.env_id)
    rows.append(
        f"| ppo_continuous_action.py | (1 env in the learner) | | | | {plain['charts/SPS'][-1][1]:,.0f} | | "
        f"{time_split(plain)} | same batch and update |"
    )
    print(rows[-1], flush=True)

    lines = [
        f"{SCRIPT}.py on {args.env_id}, batch {BATCH}, {args.iterations} iterations per run (medians of "
        f"iterations 2..{args.iterations}); machine: {cores} cores",
        "",
    ] + rows
    report("\n".join(lines), args.out)
    if args.plot:
        plot(points, args.plot, args.env_id)


def plot(points: list[dict], path: str, env_id: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    for key, label in (("experience_sps", "experience SPS"), ("sps", "end-to-end SPS")):
        ax.plot([p["samplers"] for p in points], [p[key] for p in points], marker="o", label=label)
    ax.axvline(os.cpu_count(), color="grey", linestyle=":", label=f"{os.cpu_count()} cores")
    ax.set_xlabel("sampler processes")
    ax.set_xticks([p["samplers"] for p in points])
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"{SCRIPT}.py on {env_id}")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
