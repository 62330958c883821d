"""ppo_atari_multigpu.py: the gradient of 2 ranks equals the gradient of 1 process, runs under torchrun
(2 processes; two launches joined by a c10d rendezvous as two "nodes"; a resume), identical weights on
every rank, collective early stopping and straggler preemption, a killed or hung rank ending the job,
bad input on every rank, a refused write (disk full) ending the job in rank 0's one line, a world of one
that trains like ppo_atari.py, and the named pieces of the loop (explained variance from every rank's
sums, the preemption counter, the collective timer, the clip fraction over all minibatches, the resume
command)."""

import ast
import math
import multiprocessing
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

import atari_fakes  # noqa: F401  (registers FakeAtari-v0)
import ppo_atari
import ppo_atari_multigpu as script
import ppolab.distributed
from ppolab.distributed import explained_variance_of
from ppolab.stops import resume_hint
from helpers import (
    finished_run,
    LINE,
    METRICS,
    REPO,
    assert_evaluate_flag_matches_training,
    assert_evaluation_videos,
    alive,
    assert_progress_lines,
    fake_atari_args,
    load,
    only_run_dir,
    process_table,
    read_scalars,
)

pytestmark = pytest.mark.exclusive  # torchrun jobs under collective timeouts; ranks found in the process table

ITERATIONS, NUM_ENVS, NUM_STEPS = 6, 4, 32
BATCH = NUM_ENVS * NUM_STEPS
TINY = [
    "--env-id",
    "Breakout",
    "--num-envs",
    NUM_ENVS,
    "--num-steps",
    NUM_STEPS,
    "--num-minibatches",
    2,
    "--max-episode-steps",
    60,
]
HASHES = re.compile(r"^final weights of the (\d+) ranks: sha256 (.+)$", re.M)


def torchrun(
    *argv,
    cwd,
    launcher=("--standalone", "--nproc_per_node=2"),
    timeout=300,
    popen=False,
    file_size_limit=None,
    env=None,
):
    """`torchrun <launcher> ppo_atari_multigpu.py argv... --no-cuda` (as `python -m torch.distributed.run`),
    on the CPU wherever the suite runs, one thread per process, stdout and stderr together; with
    `file_size_limit` no process of the job may write a file larger than that many bytes (as on a full disk); `env`:
    more environment variables."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *launcher,
        str(REPO / "ppo_atari_multigpu.py"),
        *map(str, argv),
        "--no-cuda",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    output = dict(cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if popen:
        return subprocess.Popen(command, **output, start_new_session=True)

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.run(command, **output, timeout=timeout, preexec_fn=limit_file_size if file_size_limit else None)


def weight_hashes(output: str) -> list[str]:
    """The per-rank weight checksums that rank 0 printed at the end."""
    match = HASHES.search(output)
    assert match, output
    hashes = match[2].split()
    assert len(hashes) == int(match[1])
    return hashes


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    """2 ranks x 2 Breakout environments for ITERATIONS iterations, with a KL target small enough to
    stop some updates early, and small enough that the ranks' own KLs sometimes fall on both sides."""
    cwd = tmp_path_factory.mktemp("multigpu")
    result = torchrun(
        *TINY,
        "--total-timesteps",
        ITERATIONS * BATCH,
        "--checkpoint-every",
        1,
        "--save-model",
        "--eval-episodes",
        1,
        "--no-anneal-lr",
        "--target-kl",
        0.0001,
        cwd=cwd,
    )
    return finished_run(result, cwd)


def test_two_ranks_train_one_model_with_identical_weights(e2e):
    result = e2e["result"]
    assert result.returncode == 0, result.stdout
    assert "2 ranks x 2 environments, backend gloo" in result.stdout
    hashes = weight_hashes(result.stdout)
    assert len(hashes) == 2 and hashes[0] == hashes[1]
    model = load(e2e["run_dir"] / "model.pt")
    assert model["global_step"] == ITERATIONS * BATCH


def test_checkpoint_holds_rank_zeros_rng_dict_and_every_ranks(e2e):
    """`rng` is a dict as in every script (rank 0's streams); `rank_rng` holds every rank's, for a resume
    with the same world size."""
    checkpoint = load(e2e["run_dir"] / "checkpoint.pt")
    assert isinstance(checkpoint["rng"], dict) and set(checkpoint["rng"]) == {"torch", "numpy", "python"}
    rank_rng = checkpoint["rank_rng"]
    assert isinstance(rank_rng, list) and len(rank_rng) == 2
    assert all(isinstance(state, dict) and set(state) == {"torch", "numpy", "python"} for state in rank_rng)
    assert torch.equal(rank_rng[0]["torch"], checkpoint["rng"]["torch"])
    assert not torch.equal(rank_rng[0]["torch"], rank_rng[1]["torch"])  # the ranks' own streams (seed + rank)
    assert rank_rng[0]["python"] != rank_rng[1]["python"]


def test_rank_zero_logs_every_metric_once_per_iteration(e2e):
    scalars = e2e["scalars"]
    for tag in METRICS + [
        "perf/comm_time",
        "perf/rollout_time_max",
        "debug/update_epochs",
        "debug/preempted_ranks",
    ]:
        assert tag in scalars, tag
        if not tag.startswith("charts/episodic"):
            assert [step for step, _ in scalars[tag]] == [BATCH * k for k in range(1, ITERATIONS + 1)], tag
    assert "perf/learn_time" not in scalars  # update_time minus comm_time: not a metric of its own
    # the collectives are timed inside the update
    assert all(comm <= update for (_, comm), (_, update) in zip(scalars["perf/comm_time"], scalars["perf/update_time"]))
    assert max(value for _, value in scalars["debug/first_minibatch_ratio_deviation"]) < 1e-5
    assert len(scalars["eval/episodic_return"]) == 1


def test_one_line_per_iteration_with_episodes_and_the_evaluation_lines(e2e):
    stdout = e2e["result"].stdout
    assert_progress_lines(stdout, LINE, e2e["scalars"]["charts/episodic_return"], ITERATIONS, BATCH)
    lines = [line for line in stdout.splitlines() if LINE.match(line)]
    assert all(re.search(r", update [\d.]+s, comm [\d.]+s\)$", line) for line in lines), lines
    assert re.search(r"^evaluation: 1 episodes, mean return -?[\d.]+ \+- [\d.]+$", stdout, re.M), stdout
    assert_evaluate_flag_matches_training("ppo_atari_multigpu", e2e, 1)


def test_episodes_of_every_rank_are_logged(e2e):
    # a game of global env k ends at a step numbered base + t * NUM_ENVS + k + 1; ranks hold envs 0-1 and 2-3
    steps = [step for step, _ in e2e["scalars"]["charts/episodic_return"]]
    assert {(step - 1) % NUM_ENVS for step in steps} == set(range(NUM_ENVS))
    assert len(steps) == len(set(steps))


def test_early_stopping_is_collective(e2e):
    scalars = e2e["scalars"]
    epochs = [value for _, value in scalars["debug/update_epochs"]]
    assert min(epochs) < 4  # some updates stopped early, all ranks after the same epoch:
    assert e2e["result"].returncode == 0  # no hang, and identical weights (above)


def test_resume_under_torchrun_continues_on_every_rank(e2e, tmp_path):
    (tmp_path / "run").mkdir()
    shutil.copy(e2e["run_dir"] / "checkpoint.pt", tmp_path / "run" / "checkpoint.pt")
    # a larger --total-timesteps: one iteration more to run
    result = torchrun(
        "--resume", tmp_path / "run" / "checkpoint.pt", "--total-timesteps", (ITERATIONS + 1) * BATCH, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout
    assert f"at iteration {ITERATIONS}, global step {ITERATIONS * BATCH}" in result.stdout
    hashes = weight_hashes(result.stdout)
    assert hashes[0] == hashes[1]
    steps = [step for step, _ in read_scalars(tmp_path / "run")["charts/learning_rate"]]
    assert steps == [(ITERATIONS + 1) * BATCH]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_launches_with_a_c10d_rendezvous_form_one_job_with_preemption(tmp_path):
    """Two torchrun launches, as two machines would start them, join through a c10d rendezvous on
    127.0.0.1. The last rank is a straggler (0.05 s of sleep per step, injected from outside the script by
    benchmark/straggler/sitecustomize.py): with --preempt-fraction 0.5 its
    rollouts end early once the other rank is done, and the update still agrees on every rank."""
    launcher = (
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--rdzv-id=test",
    )
    argv = [
        *TINY,
        "--total-timesteps",
        3 * BATCH,
        "--update-epochs",
        1,
        "--preempt-fraction",
        0.5,
    ]
    straggler = {"PYTHONPATH": f"{REPO / 'benchmark' / 'straggler'}{os.pathsep}{REPO}", "STRAGGLER_DELAY": "0.05"}
    nodes = [torchrun(*argv, cwd=tmp_path, launcher=launcher, popen=True, env=straggler) for _ in range(2)]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    rank0 = next(output for output in outputs if "final weights" in output)
    assert "2 ranks x 2 environments" in rank0
    hashes = weight_hashes(rank0)
    assert len(hashes) == 2 and hashes[0] == hashes[1]
    scalars = read_scalars(only_run_dir(tmp_path / "runs"))
    preempted = [value for _, value in scalars["debug/preempted_ranks"]]
    assert preempted and all(value == 1 for value in preempted)
    steps = [step for step, _ in scalars["charts/SPS"]]
    assert steps[-1] >= 3 * BATCH and len(steps) > 3  # shorter rollouts: more iterations for the same steps
    assert all(b - a < BATCH for a, b in zip([0] + steps, steps))


def rank_processes(launcher_pid: int) -> dict[int, int]:
    """{RANK: pid} of the training processes that a torchrun process started (their environment, from /proc)."""
    ranks = {}
    for pid, (ppid, _, _) in process_table().items():
        if ppid == launcher_pid:
            try:
                environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
            except OSError:  # gone meanwhile
                continue
            ranks.update({int(item[5:]): pid for item in environ if item.startswith(b"RANK=")})
    return ranks


@pytest.mark.parametrize("fault", ["killed", "hung"])
def test_a_killed_or_hung_rank_ends_the_job_within_the_timeout(fault, tmp_path):
    """Rank 1 is killed (SIGKILL) or frozen (SIGSTOP) mid-run: the job ends non-zero within the
    collective timeout plus torchrun's grace period, and no rank is left running."""
    job = torchrun(*TINY, "--total-timesteps", 1000 * BATCH, "--timeout", 10, cwd=tmp_path, popen=True)
    try:
        deadline = time.time() + 120
        while not list((tmp_path / "runs").glob("*/events.out.tfevents.*")) and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # into the training loop
        ranks = rank_processes(job.pid)
        assert sorted(ranks) == [0, 1]
        os.kill(ranks[1], signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
        start = time.time()
        output = job.communicate(timeout=90)[0]
        elapsed = time.time() - start
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode != 0
    assert elapsed < 90
    if fault == "killed":
        assert "Signal 9 (SIGKILL) received by PID" in output
    else:  # rank 0's collective timed out: our one line, then torchrun stopped rank 1
        assert "ppo_atari_multigpu.py: rank 0: lost the other ranks" in output, output
    time.sleep(1)
    assert not any(alive(pid) for pid in ranks.values())


def test_world_size_not_dividing_the_environments_fails_on_every_rank(tmp_path):
    """Every rank checks before joining the process group, so each prints the line and exits 2; torchrun
    stops the job at the first exit, so a slower rank may be ended by its SIGTERM before (or while) it does."""
    result = torchrun(*TINY[:2], "--num-envs", 3, cwd=tmp_path, timeout=120)
    assert result.returncode != 0
    line = "ppo_atari_multigpu.py: error: the world size 2 does not divide --num-envs 3"
    exit_codes = re.findall(r"exitcode\s*: (-?\d+) ", result.stdout)
    assert sorted(exit_codes) in (["2", "2"], ["-15", "2"], ["143", "2"]), result.stdout
    assert result.stdout.count(line) >= exit_codes.count("2"), result.stdout  # every rank that exited 2 said why
    assert 'ppo_atari_multigpu.py", line' not in result.stdout  # no traceback through our file
    # torchrun's summary, the last thing it prints, gives the line as the failed rank's "traceback"
    assert re.search(rf"Root Cause[\s\S]*traceback : {re.escape(line)}", result.stdout), result.stdout
    assert not (tmp_path / "runs").exists()


# A checkpoint of 20 MB, TensorBoard events of a few KB: 1 MB refuses the checkpoint, 2,000 bytes the events
@pytest.mark.parametrize(
    "limit, checkpoint_every, file",
    [(1_000_000, 1, "{run_dir}/checkpoint.pt"), (2_000, 0, "the TensorBoard events in {run_dir}")],
)
def test_a_refused_write_ends_the_job_in_rank_zeros_one_line(limit, checkpoint_every, file, tmp_path):
    """A write the file system refuses (here: larger than the file-size limit, as a full disk refuses it) ends
    the job: rank 0 prints the one line that names the file and where to resume from, the other rank ends
    without an error of its own (no "lost the other ranks") and without waiting for its --timeout, and no
    partial checkpoint stays. A slow rank 1 may get torchrun's SIGTERM first, which it says as any run does. torchrun
    adds its own summary of the failed job, which it prints for every job whose rank exits non-zero; no line of it
    comes from this file (no traceback through it)."""
    start = time.time()
    result = torchrun(
        *TINY,
        "--total-timesteps",
        3 * BATCH,
        "--checkpoint-every",
        checkpoint_every,
        cwd=tmp_path,
        timeout=240,
        file_size_limit=limit,
    )
    assert time.time() - start < 200  # the default --timeout is 300 s
    run_dir = only_run_dir(tmp_path / "runs").relative_to(tmp_path)
    advice = " yet" if checkpoint_every else " (--checkpoint-every N writes one every N iterations)"
    stopped_by_torchrun = "ppo_atari_multigpu.py: rank 1: terminated (SIGTERM)"
    ours = [
        line
        for line in result.stdout.splitlines()
        if line.startswith("ppo_atari_multigpu.py") and not line.startswith(stopped_by_torchrun)
    ]
    assert ours == [
        f"ppo_atari_multigpu.py: error: cannot write {file.format(run_dir=run_dir)}: File too large; "
        f"no checkpoint in {run_dir}{advice}"
    ], result.stdout
    assert result.returncode == 1
    assert 'ppo_atari_multigpu.py", line' not in result.stdout
    assert [path.name for path in (tmp_path / run_dir).iterdir() if not path.name.startswith("events.")] == []


def test_the_resume_command_is_the_launchs_own(tmp_path, monkeypatch):
    """Ctrl-C and a refused write name the last checkpoint and the command that resumes from it: under
    torchrun (a world of more than one) the same torchrun command with --resume, else `python <script>`."""
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resume_hint(str(tmp_path)) == (
        f"last checkpoint {checkpoint}; continue with: the same torchrun command with --resume {checkpoint}"
    )
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert resume_hint(str(tmp_path)) == (
        f"last checkpoint {checkpoint}; continue with: python {sys.argv[0]} --resume {checkpoint}"
    )


# The gradient of two ranks, each on its share of one minibatch, against one process on all of it -----

MINIBATCH = 16


def gradient_problem():
    """A fixed agent and minibatch: uint8 frames, actions, old log-probs and values, advantages, returns."""
    torch.manual_seed(0)
    agent = script.Agent(4)
    g = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 256, (MINIBATCH, 4, 84, 84), dtype=torch.uint8, generator=g)
    actions = torch.randint(0, 4, (MINIBATCH,), generator=g)
    with torch.no_grad():
        _, logprobs, _, values = agent.get_action_and_value(obs, actions)
    logprobs = logprobs + 0.1 * torch.randn(MINIBATCH, generator=g)  # ratios away from 1: clipping matters
    advantages = 3 + 2 * torch.randn(MINIBATCH, generator=g)
    returns = values + torch.randn(MINIBATCH, generator=g)
    return agent, (obs, actions, logprobs, advantages, returns, values)


def loss_of(agent, batch, idx, adv_mean, adv_std):
    obs, actions, logprobs, advantages, returns, values = (x[idx] for x in batch)
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    return script.ppo_loss(
        newlogprob,
        entropy,
        newvalue,
        logprobs,
        (advantages - adv_mean) / (adv_std + 1e-8),
        returns,
        values,
        script.Args(),
        torch.tensor(1.0),
    )


def rank_gradient(rank: int, store: str, shares: list[list[int]], out: str):
    """One rank: its share of the minibatch, the global advantage statistics, one all-reduce."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=len(shares))
    agent, batch = gradient_problem()
    idx = torch.tensor(shares[rank])
    ((adv_mean, adv_std),) = script.global_advantage_stats(batch[3], [idx], torch.device("cpu"))
    loss, stats = loss_of(agent, batch, idx, adv_mean, adv_std)
    loss.backward()
    local = [p.grad.clone() for p in agent.parameters()]
    averaged = script.all_reduce_gradients(
        list(agent.parameters()), len(idx), torch.stack(list(stats.values())), torch.device("cpu")
    )
    own = torch.stack(list(stats.values()))
    torch.save(dict(local=local, grads=[p.grad for p in agent.parameters()], own=own, stats=averaged), out)
    dist.destroy_process_group()


@pytest.mark.parametrize("split", [8, 5])
def test_two_ranks_average_to_the_gradient_of_the_whole_minibatch(split, tmp_path):
    """Each rank takes its piece of a shuffled minibatch (8 + 8 samples, or unequal 5 + 11 as after a
    preemption); the all-reduced gradient equals one process's gradient of the whole minibatch, with
    advantages normalised over the whole minibatch as ppo_atari.py does, and so do the loss statistics."""
    order = torch.randperm(MINIBATCH, generator=torch.Generator().manual_seed(2)).tolist()
    shares = [order[:split], order[split:]]
    context = multiprocessing.get_context("spawn")
    ranks = [
        context.Process(target=rank_gradient, args=(r, str(tmp_path / "store"), shares, str(tmp_path / f"{r}.pt")))
        for r in range(2)
    ]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=120)
    assert [p.exitcode for p in ranks] == [0, 0]
    results = [load(tmp_path / f"{r}.pt") for r in range(2)]

    agent, batch = gradient_problem()
    everything = torch.arange(MINIBATCH)
    loss, stats = loss_of(agent, batch, everything, batch[3].mean(), batch[3].std())
    loss.backward()
    for rank in results:
        for averaged, single in zip(rank["grads"], (p.grad for p in agent.parameters())):
            # float32 sums in another order: an entry near zero may differ by the rounding of the tensor's largest
            torch.testing.assert_close(averaged, single, rtol=1e-5, atol=1e-5 * single.abs().max().item())
        torch.testing.assert_close(rank["stats"], torch.stack(list(stats.values())), rtol=1e-5, atol=1e-7)
    # the check has teeth: a rank's own gradient differs from the whole minibatch's, and with unequal
    # shares so does the plain (unweighted) average of the two
    plain = [(a + b) / 2 for a, b in zip(results[0]["local"], results[1]["local"])]
    assert not torch.allclose(results[0]["local"][-1], agent.critic.bias.grad, rtol=1e-3)
    if split != MINIBATCH // 2:
        assert not torch.allclose(plain[-1], agent.critic.bias.grad, rtol=1e-3)
    # Early stopping (--target-kl) is decided from the all-reduced approx_kl, which both ranks hold to the bit; each
    # rank's own differs, so a target between the two would stop one rank alone and leave the other waiting in
    # its next all-reduce: the decision must be the collective one
    kl = list(stats).index("approx_kl")
    own = [rank["own"][kl].item() for rank in results]
    assert own[0] != own[1] and results[0]["stats"][kl].item() == results[1]["stats"][kl].item()


# A world of one (no torchrun), in-process ----------------------------------------------------------


def test_a_world_of_one_trains_like_ppo_atari(tmp_path):
    """Same seed, same games, same minibatches: the losses of ppo_atari.py, up to the float rounding of
    the global advantage statistics and the count-weighted gradient."""
    runs = [
        read_scalars(module.main(fake_atari_args(module, tmp_path / module.__name__))) for module in (ppo_atari, script)
    ]
    assert runs[0]["charts/episodic_return"] == runs[1]["charts/episodic_return"]
    for tag in ("losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/approx_kl"):
        assert [step for step, _ in runs[0][tag]] == [step for step, _ in runs[1][tag]]
        assert [v for _, v in runs[1][tag]] == pytest.approx([v for _, v in runs[0][tag]], rel=1e-3, abs=1e-6), tag


def test_clipfrac_is_the_mean_over_the_updates_minibatches(tmp_path, monkeypatch):
    """ppo_loss reports the clip fractions 0, 1, 2, ... in call order (and the same numbers as old_approx_kl):
    losses/clipfrac is the mean over the update's 4 minibatches (2 epochs x 2), after the all-reduce;
    the other losses are the last minibatch's, as in CleanRL."""
    real_loss, calls = script.ppo_loss, []

    def numbered_loss(*args):
        loss, stats = real_loss(*args)
        number = torch.tensor(float(len(calls)))
        calls.append(number)
        return loss, {**stats, "clipfrac": number, "old_approx_kl": number}

    monkeypatch.setattr(script, "ppo_loss", numbered_loss)
    scalars = read_scalars(script.main(fake_atari_args(script, tmp_path, update_epochs=2)))
    assert len(calls) == 8  # 2 iterations x 2 epochs x 2 minibatches
    assert [value for _, value in scalars["losses/clipfrac"]] == pytest.approx([1.5, 5.5])
    assert [value for _, value in scalars["losses/old_approx_kl"]] == pytest.approx([3, 7])


def test_explained_variance_from_every_ranks_sums_is_the_whole_batchs():
    """Two ranks' ValueSums (unequal shares, as after a preemption), added up: the explained variance of
    the concatenated samples, as numpy computes it."""
    g = torch.Generator().manual_seed(0)
    values = [torch.randn(5, 2, generator=g), torch.randn(3, 2, generator=g)]
    returns = [1 + v + 0.5 * torch.randn(v.shape, generator=g) for v in values]
    y = torch.cat([r.reshape(-1) for r in returns]).double().numpy()
    y_pred = torch.cat([v.reshape(-1) for v in values]).double().numpy()
    sums = [ppolab.distributed.ValueSums.of(v, r) for v, r in zip(values, returns)]
    assert sums[0].count == 10 and sums[1].count == 6
    assert explained_variance_of(sums) == pytest.approx(1 - np.var(y - y_pred) / np.var(y), rel=1e-6)
    # one rank's sums alone give another number: the sums of every rank matter
    assert explained_variance_of(sums[:1]) != pytest.approx(explained_variance_of(sums), rel=1e-3)
    assert math.isnan(explained_variance_of([ppolab.distributed.ValueSums.of(torch.zeros(4), torch.ones(4))]))


def test_preemption_reads_the_counter_without_changing_it():
    """The store's counter of finished rollouts: read (0 before any rank finished, no wait for the key),
    counted up by a finished rollout, one counter per iteration; a rollout is preempted only past its
    minimum steps and before its last step."""
    preemption = script.Preemption(dist.HashStore(), after=1, min_steps=4, num_steps=8)
    assert preemption.finished_rollouts(3) == 0
    assert not preemption.preempts(3, 5)
    preemption.finish_rollout(3)
    assert preemption.finished_rollouts(3) == preemption.finished_rollouts(3) == 1
    assert preemption.preempts(3, 4) and preemption.preempts(3, 7)
    assert not preemption.preempts(3, 3)  # fewer than its minimum steps
    assert not preemption.preempts(3, 8)  # at its last step the rollout ends anyway
    assert not preemption.preempts(4, 5)  # another iteration's counter
    two = script.Preemption(dist.HashStore(), after=2, min_steps=1, num_steps=8)
    two.finish_rollout(1)
    assert not two.preempts(1, 4)
    two.finish_rollout(1)
    assert two.preempts(1, 4)


def test_comm_timer_synchronizes_only_when_asked_on_cuda(monkeypatch):
    """--sync-timing: the GPU is synchronized on entry and exit of each timed collective; without it
    (the default) never, and on the CPU never."""
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    cuda = torch.device("cuda", 0)
    for device, sync, expected in ((cuda, False, 0), (torch.device("cpu"), True, 0), (cuda, True, 4)):
        syncs.clear()
        comm = ppolab.distributed.CommTimer(device, sync)
        for _ in range(2):
            with comm:
                pass
        assert len(syncs) == expected and comm.seconds >= 0
    assert syncs == [cuda] * 4


def test_bad_input_fails_before_joining(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(SystemExit) as exit_info:
        script.main(fake_atari_args(script, tmp_path, num_envs=6))
    assert exit_info.value.code == 2
    assert "the world size 4 does not divide --num-envs 6" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "1")
    for overrides, words in (
        (dict(preempt_fraction=1.5), "--preempt-fraction"),
        (dict(backend="nccl"), "--backend nccl needs CUDA"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            script.main(fake_atari_args(script, tmp_path, **overrides))
        assert exit_info.value.code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    # another backend is refused by the script's command line itself (tyro reads the choices from Args), before main
    monkeypatch.setattr(sys, "argv", ["ppo_atari_multigpu.py", "--backend", "mpi"])
    with pytest.raises(SystemExit) as exit_info:
        ppolab.parse(script.Args)
    assert exit_info.value.code == 2 and "mpi" in capsys.readouterr().err


def test_ranks_sharing_a_gpu_use_gloo(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    args = script.Args()
    assert [ppolab.distributed.select_device(args, i) for i in range(2)] == [
        torch.device("cuda", 0),
        torch.device("cuda", 1),
    ]
    assert ppolab.distributed.select_backend(args, torch.device("cuda", 0)) == "nccl"
    shared = script.Args(device_ids=[1])
    assert (
        ppolab.distributed.select_device(shared, 0)
        == ppolab.distributed.select_device(shared, 1)
        == torch.device("cuda", 1)
    )
    assert ppolab.distributed.select_backend(shared, torch.device("cuda", 1)) == "gloo"
    with pytest.raises(SystemExit):
        ppolab.distributed.select_backend(script.Args(device_ids=[1], backend="nccl"), torch.device("cuda", 1))
    assert ppolab.distributed.select_device(script.Args(cuda=False), 1) == torch.device("cpu")
    # a PyTorch built without NCCL (as the CPU wheels): gloo by default, and --backend nccl is refused
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    assert ppolab.distributed.select_backend(args, torch.device("cuda", 0)) == "gloo"
    with pytest.raises(SystemExit):
        ppolab.distributed.select_backend(script.Args(backend="nccl"), torch.device("cuda", 0))


def test_evaluate_capture_video_records_the_first_game(e2e, capsys):
    assert_evaluation_videos(script, e2e["run_dir"] / "model.pt", 1, 1, capsys)


# THE CALLS EVERY RANK MUST REACH -----------------------------------------------------------------

COLLECTIVE = "# collective: every rank calls this"
# how the script calls what every rank must reach: the run's job and its own collectives (broadcast_weights, an
# all_gather or all_reduce through the timer `comm`, the update step's all-reduce), joining the job, DistributedRun
# (rank 0 sends the arguments), the checkpoint (gathers every rank's random streams), the end (compares the weights)
COLLECTIVES = {
    "dist.init_process_group",
    "ppolab.distributed.DistributedRun",
    "broadcast_weights",
    "comm",
    "update",
    "run.checkpoint_if_due",
    "run.finish",
}


def unmarked_collectives(source: str) -> tuple[set[str], list[str]]:
    """The collectives that `source` calls, and those of its calls (`line: call`) without COLLECTIVE on their line
    or on the line above."""
    lines = source.splitlines()
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and ast.unparse(node.func) in COLLECTIVES
    ]
    unmarked = [
        f"{call.lineno}: {ast.unparse(call.func)}"
        for call in calls
        if COLLECTIVE not in lines[call.lineno - 1] and not lines[call.lineno - 2].strip().startswith(COLLECTIVE)
    ]
    return {ast.unparse(call.func) for call in calls}, unmarked


def test_every_call_that_every_rank_must_reach_is_marked_where_it_is_called():
    """A reader sees, where it is called, that a call must be reached by every rank (a rank that skips it leaves
    the others waiting): each is marked with the one comment COLLECTIVE, and the comment marks nothing else."""
    source = Path(script.__file__).read_text()
    called, unmarked = unmarked_collectives(source)
    assert called == COLLECTIVES  # every one of them is still called so (a renamed call would escape the check)
    assert not unmarked
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and ast.unparse(n.func) in COLLECTIVES]
    assert source.count(COLLECTIVE) == len(calls)
    # the check itself: a marker taken away is seen
    assert unmarked_collectives(source.replace(f"  {COLLECTIVE}; weights compared first", ""))[1] == [
        f"{next(c.lineno for c in calls if ast.unparse(c.func) == 'run.finish')}: run.finish"
    ]
