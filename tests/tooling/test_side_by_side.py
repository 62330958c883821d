"""benchmark.side_by_side without a GPU and without CleanRL's or LeanRL's code: the changes it makes to their files
(tested on stand-ins written for these tests, tests/tooling/side_by_side/, which hold the lines the changes touch
as CleanRL 1.2.0's ppo_atari_envpool.py and LeanRL's ppo_atari_envpool_torchcompile.py hold them), a file that they
do not fit refused in one line, and its dry run on the CPU with the stand-ins in place of the two programs."""

import ast
import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch

from benchmark import side_by_side as sbs
from scripts import REPO

STAND_INS = REPO / "tests" / "tooling" / "side_by_side"
LEANRL, CLEANRL = STAND_INS / "leanrl_like.py", STAND_INS / "cleanrl_like.py"


def run_tool(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "benchmark.side_by_side", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.parametrize("program, path", [("LeanRL", LEANRL), ("CleanRL", CLEANRL)])
def test_the_changes_make_exactly_the_edits_they_name(program, path):
    text = path.read_text()
    changed = sbs.apply_patches(text, sbs.patches(program, has_distutils=True), program)
    ast.parse(changed)
    assert "import gymnasium as gym\n" in changed and not re.search(r"^import gym$", changed, re.M)
    assert "        observations, _ = super().reset(**kwargs)\n" in changed
    assert (
        "        observations, rewards, terminations, truncations, infos = super().step(action)\n"
        "        dones = terminations | truncations\n"
    ) in changed
    assert not re.search(r"^\s+envs\.(num_envs|single_action_space|single_observation_space) = ", changed, re.M)
    assert "self.single_action_space, self.single_observation_space = env.single_action_space" in changed
    assert ("preserve_module_state=False" in changed) == (program == "LeanRL")
    # nothing else: the lines the changes do not touch are the file's own, in order
    untouched = [line for line in text.splitlines() if not re.search(r"gym$|super\(\)|envs\.\w+ = |to_module", line)]
    kept = iter(changed.splitlines())
    assert all(any(line == other for other in kept) for line in untouched)


def test_without_distutils_cleanrl_gets_strtobool_written_out():
    changed = sbs.apply_patches(CLEANRL.read_text(), sbs.patches("CleanRL", has_distutils=False), "CleanRL")
    assert "distutils" not in changed
    namespace = {}
    exec(changed.split("import envpool")[0].replace("import argparse", ""), namespace)  # the imports' block
    strtobool = namespace["strtobool"]
    assert [bool(strtobool(word)) for word in ("True", "true", "1", "yes", "False", "0", "no")] == [True] * 4 + [
        False
    ] * 3


def test_the_stand_ins_fail_unchanged_on_todays_packages(tmp_path):
    """So the changes are needed, and a run that passes shows them applied."""
    done = subprocess.run([sys.executable, str(LEANRL), "--no-cuda"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "No module named 'gym'" in done.stderr


def test_a_file_the_changes_do_not_fit_is_refused_in_one_line(tmp_path):
    changed = tmp_path / "ppo_atari_envpool_torchcompile.py"
    changed.write_text(LEANRL.read_text().replace("observations = super().reset(**kwargs)", "obs = self.env.reset()"))
    with pytest.raises(sbs.PatchError, match=r"0 matches of .*where 1 were expected \(envpool's reset returns"):
        sbs.apply_patches(changed.read_text(), sbs.patches("LeanRL", True), "LeanRL")
    done = run_tool("--dry-run", "--leanrl", str(changed), timeout=120)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"benchmark.gpu: error: LeanRL's {changed}: 0 matches of ")
    assert line.endswith("not the file this tool was written for")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dry-run", "--iterations", "19"], "--iterations 19: at least 20 (LeanRL logs its speed every 10)"),
        (["--dry-run", "--leanrl", "/nonexistent"], "--leanrl /nonexistent: no such file (give LeanRL's leanrl/"),
        (["--dry-run", "--cleanrl", "/nonexistent"], "--cleanrl /nonexistent: no such file"),
    ],
)
def test_bad_input_is_one_line(args, message):
    done = run_tool(*args, timeout=120)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"benchmark.gpu: error: {message}"), line


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA runs the comparison")
def test_without_cuda_it_says_so_in_one_line():
    done = run_tool("--leanrl", str(LEANRL), timeout=120)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("benchmark.gpu: error: no CUDA device here") and "--dry-run" in line


def test_the_imports_of_a_file_and_those_missing():
    assert sbs.imports("import os.path\nfrom torch import nn\nfrom . import x\nimport a, b.c\n") == [
        "os",
        "torch",
        "a",
        "b",
    ]
    assert sbs.missing_modules(["json", "no_such_module_here"], dict(os.environ)) == ["no_such_module_here"]


def test_the_dry_run_sets_the_three_side_by_side_with_the_stand_ins(tmp_path):
    out = tmp_path / "side_by_side.md"
    args = ["--dry-run", "--leanrl", str(LEANRL), "--cleanrl", str(CLEANRL), "--packages", str(tmp_path / "none")]
    done = run_tool(*args, "--modes", "eager", "cudagraphs", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# Side by side on one GPU host (dry run on the CPU: no speed measured)\n")
    assert "Breakout-v5, 2 environments x 16 steps, seed 1" in text and "20 iterations a run" in text
    number = r"[\d,]+ \(\d+\.\d s\)"
    eager = re.search(
        rf"^\| eager \| ({number}) \| ({number}) \| ({number}) \| (\d+\.\d\d) \| (\d+\.\d\d) \|$", text, re.M
    )
    assert eager, text
    assert "| --compile --cudagraphs | (eager only) | skipped: needs CUDA | skipped: needs CUDA | — | — |" in text
    assert re.search(
        r"^Env-only SPS, .*: ours' make_envs: [\d,]+; CleanRL's and LeanRL's envpool\.make: [\d,]+\.$", text, re.M
    )
    # each stand-in ran changed, and the table says how
    assert text.count("  - changed at run time: ") == 5 + 6 + (importlib.util.find_spec("distutils") is None)
    assert (
        "- LeanRL, eager: `python leanrl_like.py --env-id Breakout-v5 --total-timesteps 640 --seed 1 --no-cuda" in text
    )
    assert (
        "- CleanRL, eager: `python cleanrl_like.py --env-id Breakout-v5 --total-timesteps 640 --seed 1 --cuda False"
        in text
    )


def test_without_their_files_or_cuda_a_run_says_what_it_left_out(tmp_path):
    setting = sbs.Setting(cuda=False, dry=True, iterations=20, timeout=60, packages=tmp_path)
    text = sbs.apply_patches(LEANRL.read_text(), sbs.patches("LeanRL", True), "LeanRL")
    assert sbs.their_run("LeanRL", None, None, "eager", setting).status == "skipped: its file was not given"
    missing = tmp_path / "cleanrl" / "ppo_atari_envpool.py"
    assert sbs.their_run("CleanRL", missing, None, "eager", setting).status == f"skipped: no file {missing}"
    assert sbs.their_run("LeanRL", LEANRL, text, "cudagraphs", setting).status == "skipped: needs CUDA"
    assert sbs.their_run("LeanRL", LEANRL, text, "compile", setting).status == "not run in a dry run"
    needs = text.replace("import tyro\n", "import tyro\nimport no_such_package_here\n")
    assert sbs.their_run("LeanRL", LEANRL, needs, "eager", setting).status == (
        "skipped: needs no_such_package_here (not installed)"
    )


def test_on_a_gpu_host_it_writes_into_the_runs_folder_unless_out_is_given(tmp_path, monkeypatch, capsys):
    """Run as documented on a CUDA host (no --out), the tool writes runs/benchmark/, never the published
    benchmark/results/side_by_side.md. CUDA is said to be there and every run is answered at once: the output's path
    is under test, not the speed."""
    published = REPO / "benchmark" / "results" / "side_by_side.md"
    before = published.read_bytes() if published.exists() else None
    assert sbs.OUT.parent == REPO / "runs" / "benchmark"
    out = tmp_path / sbs.OUT.name
    monkeypatch.setattr(sbs, "OUT", out)  # (not a user's own file in runs/)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sbs, "install", lambda packages, wheelhouse: None)
    monkeypatch.setattr(sbs.gpu, "host", lambda command: {"date": "now", "command": command, "cpu": "a CPU",
                                                          "python": "3", "gpu": "a GPU", "packages": {}})  # fmt: skip
    monkeypatch.setattr(sbs, "their_run", lambda program, source, text, mode, setting: sbs.gpu.Run(program, mode,
                                                                                     sps=400.0, warmup_s=1.0))  # fmt: skip
    monkeypatch.setattr(sbs, "our_run", lambda mode, setting: sbs.gpu.Run("ours", mode, sps=500.0, warmup_s=1.0))
    monkeypatch.setattr(sbs, "env_only", lambda steps: {})
    try:
        sbs.main(["--leanrl", str(LEANRL), "--cleanrl", str(CLEANRL), "--packages", str(tmp_path / "none")])
    finally:
        now = published.read_bytes() if published.exists() else None
        if now != before:
            published.unlink() if before is None else published.write_bytes(before)
    assert now == before, "benchmark/results/side_by_side.md was written without --out"
    assert capsys.readouterr().out.endswith(f"wrote {out}\n") and out.is_file()
