"""benchmark.gpu, the plan for a lent GPU machine, without one: the whole plan runs here on the CPU (its dry
run), the bundles fit the device tool's carry limit, every command ends within the tool's 10 minutes by a
timeout of its own, and the merge turns what a machine sends back into the results table."""

import json
import os
import re
import subprocess
import sys

import pytest
from torch.utils.tensorboard import SummaryWriter

from benchmark import gpu
from scripts import REPO

MIB = 1 << 20


def test_the_dry_run_runs_every_call_of_the_plan_and_merges():
    done = subprocess.run(
        [sys.executable, "-m", "benchmark.gpu", "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,  # about 2 minutes on a quiet machine
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "dry run: every call passed" in done.stdout
    for call in ("install-1", "measure", "measure-pixels", "learn"):
        assert re.search(rf"^{call}: exit 0 in", done.stdout, re.M), call
    for script in gpu.ITERATIONS:  # every script measured eagerly (compiling is off in the dry run)
        assert re.search(rf"^\| {script}\.py \| [^|]+ \| 160 \| CPU \| [\d,]+ \| [\d,]+ \(", done.stdout, re.M), script
    assert "| new | 96 of 96 |" in done.stdout
    assert "| resumed on this machine | 192 of 192 |" in done.stdout
    assert "| resumed from the checkpoint carried back | 288 of 288 |" in done.stdout


def test_bundles_fit_the_carry_limit_and_hold_every_file_once():
    sizes = {"envpool.whl": 61 * MIB, "assets.tar.gz": 23 * MIB, "studio.whl": 12 * MIB, "core.whl": 9 * MIB}
    sizes.update({f"small{k}.whl": (k + 1) * MIB // 4 for k in range(20)})
    limit = 62 * MIB
    bundles = gpu.split_bundles(sizes, limit)
    assert all(sum(sizes[name] for name in bundle) <= limit for bundle in bundles)
    assert sorted(name for bundle in bundles for name in bundle) == sorted(sizes)
    assert len(bundles) == -(-sum(sizes.values()) // limit)  # as few as the total allows, here
    assert ["envpool.whl"] == [name for name in next(b for b in bundles if "envpool.whl" in b) if sizes[name] > MIB]
    with pytest.raises(ValueError, match="envpool.whl"):
        gpu.split_bundles(sizes, 60 * MIB)


@pytest.mark.parametrize("dry", [False, True])
def test_every_command_ends_by_its_own_timeout_within_the_tool_limit(dry, tmp_path):
    leases = gpu.plan(
        [["a.whl"], ["envpool.whl", gpu.ASSETS_FILE]], gpu.CARRY.relative_to(REPO), tmp_path if dry else None
    )
    python = re.escape(sys.executable if dry else "python3")
    # learn-more follows learn on its warm machine: no install, no check, and both fit the device time together
    (more,) = leases.pop("learn-more")
    assert "--step learn " in more.command and "pip install" not in more.command and "--step check" not in more.command
    assert gpu.PRACTICE_S + leases["learn"][-1].timeout_s - gpu.PIP_S - gpu.CHECK_S + more.timeout_s <= 15 * 60
    for lease, calls in leases.items():
        for call in calls:
            limits = [int(seconds) for seconds in re.findall(r"\btimeout (\d+) ", call.command)]
            assert sum(limits) < call.timeout_s <= 600, (call.name, limits, call.timeout_s)
            # every Python started (pip, pytest, the steps) runs under a timeout
            assert len(re.findall(rf"{python} -m", call.command)) == len(
                re.findall(rf"\btimeout \d+ {python} -m", call.command)
            ), call.command
        # a session has 15 minutes of device time, a machine's start (about two minutes) included
        assert sum(call.timeout_s for call in calls) <= 13 * 60, lease
        # only the last call does the work: a machine lost between calls loses no more than an install
        assert all("--step" not in call.command for call in calls[:-1]), lease
        assert "--step check" in calls[-1].command, lease


def test_the_merge_writes_the_table_from_what_came_back(tmp_path):
    returned = tmp_path / "returned"
    device = {"date": "2026-12-01 10:00 UTC", "device": "NVIDIA H100 80GB HBM3", "cpus": 16}
    device |= {"packages": {"torch": "2.11.0+cu130"}, "env_only_sps": {"ppo_atari_envpool": 21345}}
    gpu.write_json(returned / "install" / "device.json", device)
    common = {"script": "ppo_atari_envpool", "steps": 40960, "device": device["device"], "date": device["date"]}
    gpu.write_json(
        returned / "sps" / "ppo_atari_envpool.json",
        [
            {**common, "mode": "eager", "status": "ok", "sps": 3512, "first_iteration_s": 4.2},
            {**common, "mode": "compile", "status": "ok", "sps": 3987, "first_iteration_s": 41.5},
            {**common, "mode": "cudagraphs", "status": "stopped after 300 s"},
        ],
    )
    (returned / "tests").mkdir()
    (returned / "tests" / "pytest.txt").write_text("$ pytest -m gpu tests/test_gpu.py\n.......\n18 passed in 201.33s\n")
    learning = returned / "learning"
    writer = SummaryWriter(str(learning))
    for step, value in enumerate([1.0, 2.0, 4.0, 9.0]):
        writer.add_scalar("charts/episodic_return", value, step * 1000)
    writer.close()
    progress = {"run": "Breakout-v5__ppo_atari_envpool__1__1", "how": "new", "date": device["date"]}
    progress |= {"device": device["device"], "command": "python3 ppo_atari_envpool.py --cuda", "exit": 143}
    progress |= {"seconds": 531, "global_step": 1_843_200, "total_timesteps": 10_000_000}
    (learning / "progress-1.json").write_text(json.dumps(progress))

    text = gpu.merge([returned], tmp_path / "gpu.md", "python -m benchmark.gpu --merge returned")
    assert (tmp_path / "gpu.md").read_text() == text
    assert "Machine: NVIDIA H100 80GB HBM3, 16 CPU cores" in text
    assert (
        "| ppo_atari_envpool.py | Breakout-v5 | 40,960 | NVIDIA H100 80GB HBM3 | 21,345 | 3,512 (4.2 s) "
        "| 3,987 (41.5 s) | stopped after 300 s | 1,022 / 3,728 / 3,841 / 6,809 |"
    ) in text
    assert "| ppo_continuous_action.py | HalfCheetah-v4 |  |  |  | not measured | not measured | not measured " in text
    assert "github.com/pytorch-labs/LeanRL" in text
    assert "`pytest -m gpu tests/test_gpu.py`: 18 passed in 201.33s" in text
    assert "| new | 1,843,200 of 10,000,000 | 531 | 143 |" in text
    assert "4 episodes; the mean return of the last 4: 4.0; the last five: 1, 2, 4, 9." in text


def test_the_merge_reads_stopped_tests_keeps_the_notes_and_says_an_environment_that_failed(tmp_path):
    returned, out = tmp_path / "returned", tmp_path / "gpu.md"
    device = {"date": "2026-12-01 10:00 UTC", "device": "NVIDIA H200", "cpus": 16, "packages": {}}
    device["env_only_sps"] = {"ppo_procgen": "fails: EnvPool Procgen requires the system Qt 5 runtime on Linux."}
    gpu.write_json(returned / "install" / "device.json", device)
    (returned / "tests").mkdir()
    (returned / "tests" / "pytest.txt").write_text(  # pytest -v stopped by its timeout: no summary line
        "$ pytest -m gpu tests/test_gpu.py\n"
        "tests/test_gpu.py::test_a[ppo] PASSED [ 10%]\n"
        "tests/test_gpu.py::test_a[ppo_procgen] FAILED [ 20%]\n"
        "tests/test_gpu.py::test_b[ppo] PASSED [ 30%]\n"
    )
    text = gpu.merge([returned], out, "python -m benchmark.gpu --merge returned")
    assert "| ppo_procgen.py | starpilot |  |  | fails: EnvPool Procgen requires the system Qt 5 runtime" in text
    assert "`pytest -m gpu tests/test_gpu.py`: stopped before its end; 2 passed, 1 failed;" in text
    assert "- FAILED: `tests/test_gpu.py::test_a[ppo_procgen]`" in text
    assert "Notes" not in text
    out.write_text(text + "\n## Notes\n\nWritten by hand.\n")
    again = gpu.merge([returned], out, "python -m benchmark.gpu --merge returned")
    assert again.endswith("\n## Notes\n\nWritten by hand.\n") and again.count("## Notes") == 1
