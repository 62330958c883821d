"""benchmark.gpu, the GPU benchmark a user runs on any CUDA machine, without a GPU: its dry run on the CPU goes through
the same plan (the host, the env-only SPS, the three modes of a script, the gpu-marked tests) and reports the modes
that need CUDA as skipped; the SPS after warm-up is read from a run's own event times; bad input is one line."""

import re
import subprocess
import sys

import pytest
import torch

from benchmark import gpu
from scripts import REPO


def run_tool(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "benchmark.gpu", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )


def test_the_dry_run_goes_through_the_plan_on_the_cpu_and_skips_what_needs_cuda(tmp_path):
    out = tmp_path / "gpu.md"
    done = run_tool("--dry-run", "--scripts", "ppo", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# ppo-lab on a GPU (dry run on the CPU: no speed measured)\n")
    assert "by `python -m benchmark.gpu --dry-run --scripts ppo --out " in text
    assert "- GPU: none (no CUDA device seen by torch)" in text and re.search(
        r"^- CPU: .+, \d+ logical cores", text, re.M
    )
    assert f"torch {torch.__version__}" in text
    row = re.search(r"^\| ppo\.py \| CartPole-v1 \| 4 \| ([\d,]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", text, re.M)
    assert row, text
    env_only, eager, compiled, cudagraphs = (cell.strip() for cell in row.groups())
    assert int(env_only.replace(",", "")) > 0
    assert re.fullmatch(r"[\d,]+ \(\d+\.\d s\)", eager), eager
    assert compiled == "ran with torch.compile off (dry run)"
    assert cudagraphs == "skipped: needs CUDA"
    # the gpu-marked tests ran, and skipped without CUDA
    assert re.search(r"^`python -m pytest -m gpu tests/test_gpu\.py`: \d+ skipped", text, re.M), text


@pytest.mark.parametrize("dry_run", [False, True], ids=["cuda", "dry-run"])
def test_it_writes_into_the_runs_folder_unless_out_is_given(tmp_path, monkeypatch, capsys, dry_run):
    """Run as documented (no --out), the tool writes runs/benchmark/, never the published benchmark/results/gpu.md.
    The measurements are stand-ins (CUDA is said to be there, each run and the host are answered at once): the
    output's path is under test, not the speed."""
    published = REPO / "benchmark" / "results" / "gpu.md"
    before = published.read_bytes()
    default = gpu.DRY_RUN_OUT if dry_run else gpu.OUT
    assert default.parent == REPO / "runs" / "benchmark"
    out = tmp_path / default.name
    monkeypatch.setattr(gpu, "DRY_RUN_OUT" if dry_run else "OUT", out)  # (not a user's own file in runs/)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu, "host", lambda command: {"date": "now", "command": command, "cpu": "a CPU",
                                                      "python": "3", "gpu": "a GPU", "packages": {}})  # fmt: skip
    monkeypatch.setattr(gpu, "env_only", lambda script, steps: "1,000")
    monkeypatch.setattr(gpu, "measure", lambda script, env_id, mode, *args: gpu.Run(f"{script}.py", mode, sps=500.0,
                                                                                     first_iteration_s=1.0))  # fmt: skip
    try:
        gpu.main(["--scripts", "ppo", "--no-tests", *(["--dry-run"] if dry_run else [])])
    finally:
        changed = published.read_bytes() != before
        if changed:
            published.write_bytes(before)
    assert not changed, "benchmark/results/gpu.md was written without --out"
    assert capsys.readouterr().out.endswith(f"wrote {out}\n")
    assert "| ppo.py | CartPole-v1 | " in out.read_text() and "| 500 (1.0 s) |" in out.read_text()


def test_help_and_bad_input():
    assert run_tool("--help", timeout=120).returncode == 0
    done = run_tool("--dry-run", "--iterations", "3", "--warmup", "3", timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "benchmark.gpu: error: --warmup 3, --iterations 3: the warm-up is 1 or more, the iterations more"
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA runs the benchmark")
def test_without_cuda_it_says_so_in_one_line():
    done = run_tool("--scripts", "ppo", timeout=120)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("benchmark.gpu: error: no CUDA device here") and "--dry-run" in line


def test_the_sps_after_warm_up_counts_only_the_iterations_after_it():
    # (step, wall time, logged value): the first two iterations slow (compilation), then 1,000 steps a second
    points = [(1000, 100.0, 0), (2000, 130.0, 0), (3000, 131.0, 0), (4000, 132.0, 0), (5000, 133.0, 0)]
    assert gpu.steady_sps(points, warmup=2) == pytest.approx(1000.0)
    assert gpu.steady_sps(points, warmup=1) == pytest.approx(4000 / 33)  # from the end of the first
    assert gpu.steady_sps(points, warmup=5) is None  # nothing after the warm-up
    assert gpu.steady_sps(points, warmup=0) is None


def test_a_run_that_fails_or_outlasts_its_time_is_said_in_its_cell(tmp_path):
    run = gpu.train(
        [sys.executable, "-c", "import sys; sys.exit('bad env id')"], tmp_path, gpu.Run("x.py", "eager"), 2, 60
    )
    assert run.cell() == "exit 1: bad env id"
    run = gpu.train([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, gpu.Run("x.py", "eager"), 2, 1)
    assert run.cell() == "stopped after 1 s"


def test_the_gpu_test_files_are_those_with_gpu_marked_tests():
    files = gpu.gpu_test_files()
    assert "tests/test_gpu.py" in files
    assert all(re.search(r"\bmark\.gpu\b", (REPO / path).read_text()) for path in files)
    assert "tests/test_ppo.py" not in files
