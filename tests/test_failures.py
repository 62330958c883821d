"""A run that goes wrong says so and loses nothing (the package's Run, every script's): a diverged training ends
in one line and never replaces a finite checkpoint with a non-finite one, and --evaluate refuses a model or
statistics that are not finite; two runs started in the same second get their own folders; a live run holds its
folder, so a --resume of it is refused; a resume from a file that is not its folder's latest checkpoint goes on in
a new folder, and one in its folder keeps its best model; SIGTERM ends a run as Ctrl-C does; a rollout too large
for memory, a run folder deleted or made unwritable, and Weights & Biases without a network, end in one line; the
line's resume command is quoted for the shell."""

import errno
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import diverging_envs  # noqa: F401  (registers the environments that go wrong)
import ppo
import ppo_continuous_action
from helpers import ended, load, only_run_dir, resume_args, run_script, script_command, start_script
from ppolab.checkpoints import checkpoint_data, non_finite, write_checkpoint_file
from ppolab.run import Run, new_run_dir
from ppolab.stops import resume_hint

SMALL = dict(num_envs=2, num_steps=32, num_minibatches=2, update_epochs=1, cuda=False)


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], lines
    return lines[0]


# DIVERGENCE --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script, env_id",
    [(ppo, "NanAfterCartPole-v0"), (ppo, "HugeRewardCartPole-v0"), (ppo_continuous_action, "NanAfterPendulum-v0")],
)
def test_a_run_that_diverges_ends_in_one_line_and_keeps_its_last_finite_checkpoint(script, env_id, tmp_path, capsys):
    """The environment goes wrong after 200 steps of each environment (iteration 7 of 64 steps): the run ends
    there with exit 1 and one line naming what is not finite and the last checkpoint, which holds only finite
    numbers (weights, Adam's moments, normalisation statistics); no model.pt is written."""
    args = script.Args(env_id=env_id, runs_dir=str(tmp_path), total_timesteps=20 * 64, checkpoint_every=1,
                       save_model=True, **SMALL)  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        script.main(args)
    assert exit_info.value.code == 1
    line = one_error_line(capsys)
    run_dir = only_run_dir(tmp_path)
    assert "is not finite: the training diverged" in line and f"last checkpoint {run_dir}/checkpoint.pt" in line
    checkpoint = load(run_dir / "checkpoint.pt")
    assert non_finite(checkpoint) is None
    assert 3 <= checkpoint["iteration"] < 20
    assert not (run_dir / "model.pt").exists()


def test_the_finiteness_check_sees_every_part_of_a_checkpoint():
    finite = {"model": {"w": torch.ones(3)}, "optimizer": {"state": {0: {"exp_avg": torch.zeros(2)}}}, "rng": {}}
    assert non_finite(finite) is None
    assert (
        non_finite({**finite, "obs_rms": {"mean": torch.tensor([0.0, np.nan], dtype=torch.float64)}}) == "obs_rms.mean"
    )
    assert non_finite({**finite, "optimizer": {"state": {0: {"exp_avg": torch.tensor([np.inf])}}}}) == (
        "optimizer.state.0.exp_avg"
    )
    assert non_finite({"rng": {"numpy": (1, torch.tensor([7]), 2.5)}, "step": float("nan")}) == "step"


def test_a_non_finite_checkpoint_never_replaces_a_finite_one(tmp_path, capsys):
    args = ppo.Args(runs_dir=str(tmp_path), **SMALL)
    agent = ppo.Agent(4, 2)
    saved = {"model": agent, "optimizer": torch.optim.Adam(agent.parameters())}
    with Run(args) as run:
        run.write(checkpoint_data(saved, args, 1, 64), "checkpoint.pt", 1)
        before = (Path(run.dir) / "checkpoint.pt").read_bytes()
        with torch.no_grad():
            agent.actor[0].weight[0, 0] = float("nan")
        with pytest.raises(SystemExit) as exit_info:
            run.write(checkpoint_data(saved, args, 2, 128), "checkpoint.pt", 2)
    assert exit_info.value.code == 1
    assert "model.actor.0.weight, which checkpoint.pt would hold, is not finite" in one_error_line(capsys)
    assert (Path(run.dir) / "checkpoint.pt").read_bytes() == before


def test_evaluate_refuses_a_model_that_is_not_finite(tmp_path, capsys):
    agent = ppo.Agent(4, 2)
    with torch.no_grad():
        agent.critic[2].bias.fill_(float("inf"))
    path = tmp_path / "model.pt"
    saved = {"model": agent, "optimizer": torch.optim.Adam(agent.parameters())}  # as a saved model holds them
    write_checkpoint_file(checkpoint_data(saved, ppo.Args(), 1, 512), str(path))
    with pytest.raises(SystemExit) as exit_info:
        ppo.main(ppo.Args(evaluate=str(path), cuda=False))
    assert exit_info.value.code == 2
    assert f"{path} holds weights that are not finite (model.critic.2.bias)" in one_error_line(capsys)


def test_evaluate_refuses_observation_statistics_that_are_not_finite(tmp_path, capsys):
    """The weights finite, the observation normalisation's variance not: the policy would see NaN observations."""
    script = ppo_continuous_action
    agent, obs_rms = script.Agent(4, 2), script.ObsNormalizer((4,), 10.0).rms
    obs_rms.var[1] = np.nan
    path = tmp_path / "model.pt"
    saved = {"model": agent, "optimizer": torch.optim.Adam(agent.parameters()), "obs_rms": obs_rms}
    write_checkpoint_file(checkpoint_data(saved, script.Args(), 1, 512), str(path))
    with pytest.raises(SystemExit) as exit_info:
        script.main(script.Args(evaluate=str(path), cuda=False))
    assert exit_info.value.code == 2
    assert f"{path} holds statistics that are not finite (obs_rms.var)" in one_error_line(capsys)


def test_the_line_of_a_stopped_run_without_a_checkpoint_yet_does_not_advise_the_flag_it_was_given(tmp_path, capsys):
    """--checkpoint-every 100 and a run that diverges at iteration 7: no checkpoint yet, and the line does not say
    "--checkpoint-every N writes one" (the advice for a run started without it)."""
    args = ppo.Args(env_id="NanAfterCartPole-v0", runs_dir=str(tmp_path), total_timesteps=20 * 64, checkpoint_every=100,
                    **SMALL)  # fmt: skip
    with pytest.raises(SystemExit):
        ppo.main(args)
    assert one_error_line(capsys).endswith(
        f"nothing non-finite was saved; no checkpoint in {only_run_dir(tmp_path)} yet"
    )


def test_the_resume_command_is_quoted_for_the_shell(tmp_path):
    """A run folder whose path has a space and a quote in it: the printed command, pasted into a shell, gives the
    path as one argument."""
    run_dir = tmp_path / "my runs" / "it's a run"
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoint.pt").write_bytes(b"")
    hint = resume_hint(str(run_dir), 1)
    command = hint.split("; continue with: ")[1]
    assert shlex.split(command)[-2:] == ["--resume", str(run_dir / "checkpoint.pt")]


# ONE RUN, ONE FOLDER -----------------------------------------------------------------------------


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0)
    args = ppo.Args(runs_dir=str(tmp_path / "runs"))
    folders = [new_run_dir(args) for _ in range(3)]
    base = f"{tmp_path}/runs/CartPole-v1__ppo__1__1800000000"
    assert folders == [(base, None), (f"{base}-2", None), (f"{base}-3", None)]
    assert all(Path(folder).is_dir() for folder, _ in folders)


def test_a_run_that_ends_before_writing_leaves_no_folder(tmp_path):
    with pytest.raises(SystemExit), Run(ppo.Args(runs_dir=str(tmp_path / "runs"))):
        raise SystemExit(2)
    assert not (tmp_path / "runs").exists()


def wait_for(path: Path, process: subprocess.Popen, seconds: float = 120):
    deadline = time.time() + seconds
    while not path.exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert path.exists() and process.poll() is None, "the run ended before the test could act"


def test_a_live_run_holds_its_folder_and_sigterm_ends_it_as_ctrl_c_does(tmp_path):
    """While the run goes on, a --resume of its checkpoint is refused in one line (exit 2), so two processes never
    write one folder; SIGTERM, what schedulers send, ends it with one line naming the last checkpoint and the
    command that resumes it, exit 143; then the resume is accepted and trains on."""
    argv = ["--num-envs", 2, "--num-steps", 32, "--total-timesteps", 10**7, "--checkpoint-every", 1]
    process = start_script("ppo", *argv, cwd=tmp_path)
    run_dir = None
    deadline = time.time() + 120
    while run_dir is None and time.time() < deadline:
        found = list((tmp_path / "runs").glob("*/checkpoint.pt"))
        run_dir = found[0].parent if found else None
        time.sleep(0.05)
    checkpoint = run_dir / "checkpoint.pt"
    refused = run_script("ppo", "--resume", checkpoint, cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"ppo.py: error: the run in {run_dir} is still going on (another process holds its "
        "folder): stop it first, or resume from a copy of its folder"
    ]
    process.send_signal(signal.SIGTERM)
    _, stderr = ended(process, 120)
    assert process.returncode == 143
    hint = f"last checkpoint runs/{run_dir.name}/checkpoint.pt; continue with: python {script_command('ppo')[1]}"
    assert stderr.splitlines() == [f"ppo.py: terminated (SIGTERM): {hint} --resume runs/{run_dir.name}/checkpoint.pt"]
    step = load(checkpoint)["global_step"]
    resumed = run_script("ppo", "--resume", checkpoint, "--total-timesteps", step + 64, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert load(checkpoint)["global_step"] == step + 64


# RESUMING NEVER OVERWRITES NEWER WORK ------------------------------------------------------------


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_resume_from_a_file_that_is_not_its_folders_latest_checkpoint_goes_on_in_a_new_folder(tmp_path, capsys):
    """A run at iteration 4 (checkpoint.pt, model.pt, best_model.pt) with an older checkpoint kept beside them
    (old.pt, iteration 2): --resume of old.pt, best_model.pt or model.pt, and of a copy of the folder whose
    checkpoint.pt is the older one (model.pt further on), each goes on in a new run folder named after the run and
    the iteration it branches from, and says so; the run's own files stay byte for byte as they were."""
    fields = dict(runs_dir=str(tmp_path), checkpoint_every=1, eval_every=1, eval_episodes=1, **SMALL)
    run_dir = Path(ppo.main(ppo.Args(total_timesteps=2 * 64, **fields)))
    shutil.copy(run_dir / "checkpoint.pt", run_dir / "old.pt")
    ppo.main(resume_args(ppo, run_dir / "checkpoint.pt", total_timesteps=4 * 64, save_model=True))
    copy = Path(shutil.copytree(run_dir, tmp_path / "copy"))
    shutil.copy(copy / "old.pt", copy / "checkpoint.pt")
    before = {folder: folder_bytes(folder) for folder in (run_dir, copy)}
    capsys.readouterr()
    for path, iteration in (
        (run_dir / "old.pt", 2),
        (run_dir / "best_model.pt", load(run_dir / "best_model.pt")["iteration"]),
        (run_dir / "model.pt", 4),
        (copy / "checkpoint.pt", 2),
    ):
        branch = Path(ppo.main(resume_args(ppo, path, total_timesteps=6 * 64)))
        assert branch.parent == tmp_path and branch.name.startswith(f"{path.parent.name}__from-iteration-{iteration}")
        assert (load(branch / "checkpoint.pt")["iteration"], load(path)["iteration"]) == (6, iteration)
        assert f"resumed from {path} at iteration {iteration}" in capsys.readouterr().out
    assert {folder: folder_bytes(folder) for folder in (run_dir, copy)} == before
    out = capsys.readouterr().out
    ppo.main(resume_args(ppo, run_dir / "checkpoint.pt", total_timesteps=5 * 64))  # its own latest: in place
    assert load(run_dir / "checkpoint.pt")["iteration"] == 5 and "new run folder" not in out


def test_a_resumed_run_keeps_its_best_model_unless_an_evaluation_beats_it(tmp_path):
    """best_model.pt holds its score (eval_return): a run resumed in its folder starts from it, and its evaluations
    replace the file only with a better model; a best model from before files held their score is scored again,
    on the same episodes, so the score is the one it had."""
    fields = dict(runs_dir=str(tmp_path), checkpoint_every=1, eval_every=1, eval_episodes=2, **SMALL)
    run_dir = Path(ppo.main(ppo.Args(total_timesteps=2 * 64, **fields)))
    best = load(run_dir / "best_model.pt")
    write_checkpoint_file({**best, "eval_return": 1e9}, str(run_dir / "best_model.pt"))  # none can beat it
    before = (run_dir / "best_model.pt").read_bytes()
    ppo.main(resume_args(ppo, run_dir / "checkpoint.pt", total_timesteps=4 * 64))
    assert (run_dir / "best_model.pt").read_bytes() == before
    old = {key: value for key, value in best.items() if key != "eval_return"}
    write_checkpoint_file(old, str(run_dir / "best_model.pt"))
    run = Run(resume_args(ppo, run_dir / "checkpoint.pt", total_timesteps=8 * 64), ppo.evaluate)
    os.close(run.lock)
    assert run.best_so_far() == pytest.approx(best["eval_return"])


def test_a_best_model_is_compared_only_with_scores_measured_the_same_way(tmp_path, capsys):
    """A resume that changes how evaluations score (--eval-episodes, --eval-deterministic) scores best_model.pt again
    with its own settings before comparing: a score measured another way (here one no evaluation can reach) is not
    the bar; with the same settings it is."""
    fields = dict(runs_dir=str(tmp_path), checkpoint_every=1, eval_every=1, eval_episodes=2, **SMALL)
    run_dir = Path(ppo.main(ppo.Args(total_timesteps=2 * 64, **fields)))
    best = load(run_dir / "best_model.pt")
    write_checkpoint_file({**best, "eval_return": 1e9}, str(run_dir / "best_model.pt"))
    capsys.readouterr()
    ppo.main(resume_args(ppo, run_dir / "checkpoint.pt", total_timesteps=3 * 64))
    assert "best, in best_model.pt: 1000000000.00" in capsys.readouterr().out  # the same settings: the same bar
    for changes in ({"eval_episodes": 3}, {"eval_deterministic": True}):
        write_checkpoint_file({**best, "eval_return": 1e9}, str(run_dir / "best_model.pt"))
        step = load(run_dir / "checkpoint.pt")["global_step"]
        ppo.main(resume_args(ppo, run_dir / "checkpoint.pt", total_timesteps=step + 64, **changes))
        out = capsys.readouterr().out
        assert "was scored with other evaluation settings" in out and "1000000000.00" not in out, out


def test_a_branch_goes_under_the_runs_dir_given_with_resume_as_the_error_advises(tmp_path, capsys):
    """--runs-dir may change on --resume: a branch (a resume from a file that is not its folder's latest) goes there.
    A --runs-dir where no folder can be made is one line that advises another, and the advice works."""
    fields = dict(runs_dir=str(tmp_path / "runs"), checkpoint_every=1, **SMALL)
    run_dir = Path(ppo.main(ppo.Args(total_timesteps=2 * 64, **fields)))
    shutil.copy(run_dir / "checkpoint.pt", run_dir / "old.pt")
    (tmp_path / "a_file").write_text("")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        ppo.main(resume_args(ppo, run_dir / "old.pt", total_timesteps=3 * 64, runs_dir=str(tmp_path / "a_file")))
    line = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "\n" not in line and "pass another --runs-dir" in line, line
    branch = Path(ppo.main(resume_args(ppo, run_dir / "old.pt", total_timesteps=3 * 64, runs_dir=str(tmp_path / "b"))))
    assert branch.parent == tmp_path / "b" and branch.name == f"{run_dir.name}__from-iteration-2"
    assert load(branch / "checkpoint.pt")["iteration"] == 3


def test_a_rollout_too_large_for_memory_is_refused_in_one_line_and_leaves_no_folder(tmp_path, capsys):
    """--num-steps 10**11 (within the bound on every count, 10**12): a rollout larger than this machine's memory. One
    line naming the flags that size it, exit 2, no run folder (nor the --runs-dir the run made)."""
    args = ppo.Args(runs_dir=str(tmp_path / "runs"), num_envs=1, num_steps=10**11, total_timesteps=10**11, cuda=False)
    with pytest.raises(SystemExit) as exit_info:
        ppo.main(args)
    assert exit_info.value.code == 2
    line = one_error_line(capsys)
    assert "cannot allocate" in line and "memory for the run" in line
    assert line.endswith("its rollout is --num-envs 1 x --num-steps 100000000000 steps: pass smaller ones")
    assert not (tmp_path / "runs").exists()


# WRITE ERRORS ------------------------------------------------------------------------------------


def test_a_run_folder_deleted_during_the_run_ends_it_in_one_line(tmp_path):
    argv = ["--num-envs", 2, "--num-steps", 32, "--total-timesteps", 10**7, "--checkpoint-every", 1]
    process = start_script("ppo", *argv, cwd=tmp_path)
    deadline = time.time() + 120
    while not list((tmp_path / "runs").glob("*/checkpoint.pt")) and time.time() < deadline:
        time.sleep(0.05)
    (run_dir,) = (tmp_path / "runs").iterdir()
    while run_dir.exists():  # the run may be writing a file in it meanwhile
        shutil.rmtree(run_dir, ignore_errors=True)
    _, stderr = ended(process, 120)
    assert process.returncode == 1
    (line,) = stderr.splitlines()
    assert (
        line.startswith(f"ppo.py: error: cannot write runs/{run_dir.name}/") and "No such file or directory" in line
    ), line


def test_a_resume_into_a_folder_it_cannot_write_is_refused(tmp_path, monkeypatch, capsys):
    """As root every folder is writable, so the test makes this one unwritable by answering os.access for it."""
    run_dir = ppo.main(ppo.Args(runs_dir=str(tmp_path), total_timesteps=64, checkpoint_every=1, **SMALL))
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path) == run_dir else real_access(path, mode))
    with pytest.raises(SystemExit) as exit_info:
        ppo.main(resume_args(ppo, f"{run_dir}/checkpoint.pt", total_timesteps=128))
    assert exit_info.value.code == 2
    assert f"--resume: cannot write into the run folder {run_dir}" in one_error_line(capsys)


def test_videos_that_cannot_be_written_end_an_evaluation_in_one_line(tmp_path, monkeypatch, capsys):
    run_dir = ppo.main(ppo.Args(runs_dir=str(tmp_path), total_timesteps=64, save_model=True, eval_episodes=1, **SMALL))
    capsys.readouterr()
    real_makedirs = os.makedirs

    def read_only(path, *args, **kwargs):  # the videos folder on a read-only file system
        if str(path).endswith("videos"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_makedirs(path, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", read_only)
    with pytest.raises(SystemExit) as exit_info:
        ppo.main(ppo.Args(evaluate=f"{run_dir}/model.pt", capture_video=True, eval_episodes=1, cuda=False))
    assert exit_info.value.code == 1
    assert f"cannot write the videos into {run_dir}/videos: Read-only file system" in one_error_line(capsys)


def test_tracking_without_a_network_ends_in_one_line_and_leaves_nothing(tmp_path):
    """A key but no network (every connection goes to a closed port): --track gives up after WANDB_INIT_TIMEOUT
    seconds and Weights & Biases' own checks, in one line of its own that says how long it waited (the time from
    the run folder's line to it), exit 1, and leaves no run folder and no ./wandb behind."""
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_API_KEY="0" * 40, WANDB_INIT_TIMEOUT="2",
               HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9", NO_PROXY="", PYTHONUNBUFFERED="1")  # fmt: skip
    env.pop("WANDB_MODE", None)
    command = script_command("ppo", "--total-timesteps", 256, "--num-steps", 32, "--track")
    process = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = [(time.monotonic(), line.rstrip("\n")) for line in process.stdout]  # both streams, as they come
    assert process.wait(timeout=300) == 1
    (started,) = [at for at, line in lines if line.startswith("run folder: ")]
    errors = [(at, line) for at, line in lines if line.startswith("ppo.py: ")]
    assert len(errors) == 1 and "--track: Weights & Biases did not start a run in " in errors[0][1], errors
    waited = int(re.search(r"did not start a run in (\d+)s, its timeout 2s", errors[0][1])[1])
    assert abs(waited - (errors[0][0] - started)) <= 2  # what it says is what it took
    assert not any("Traceback" in line for _, line in lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
