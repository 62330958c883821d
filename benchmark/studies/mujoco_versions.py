"""Whether two MuJoCo versions step the MuJoCo tasks alike: each task steps 1,000 times from the same seed with the
same random actions (no resets), its observations are recorded, and two recordings are compared step by step.

    python -m benchmark.studies.mujoco_versions record a.npz     # in an environment with one MuJoCo version
    python -m benchmark.studies.mujoco_versions record b.npz     # in one with the other
    python -m benchmark.studies.mujoco_versions compare a.npz b.npz

`compare` prints, per task, the first step whose observation differs, the largest difference there, and the
largest differences at steps 100 and 1,000 (benchmark/results/mujoco_versions.md).
"""

import argparse

import gymnasium as gym
import numpy as np

TASKS = ["Hopper-v4", "Walker2d-v4", "HalfCheetah-v4", "Ant-v4", "Humanoid-v4", "Swimmer-v4", "InvertedPendulum-v4"]
STEPS = 1000


def record(path: str):
    trajectories = {}
    for env_id in TASKS:
        env = gym.make(env_id).unwrapped  # no time limit: 1,000 steps of one episode
        rng = np.random.default_rng(0)
        obs, _ = env.reset(seed=0)
        rows = [obs]
        for _ in range(STEPS):
            obs, *_ = env.step(rng.uniform(env.action_space.low, env.action_space.high))
            rows.append(obs)
        trajectories[env_id] = np.array(rows)
        env.close()
    np.savez(path, **trajectories)


def compare(a_path: str, b_path: str):
    a, b = np.load(a_path), np.load(b_path)
    print("| task | first step that differs | largest difference then | at step 100 | at step 1,000 |")
    print("|---|---|---|---|---|")
    for env_id in a.files:
        difference = np.abs(a[env_id] - b[env_id]).max(axis=1)
        differs = np.flatnonzero(difference > 0)
        first = f"{differs[0]} | {difference[differs[0]]:.0e}" if len(differs) else "none | 0"
        print(f"| {env_id} | {first} | {difference[100]:.2g} | {difference[STEPS]:.2g} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("record").add_argument("out")
    compared = commands.add_parser("compare")
    compared.add_argument("a")
    compared.add_argument("b")
    options = parser.parse_args()
    if options.command == "record":
        record(options.out)
    else:
        compare(options.a, options.b)
