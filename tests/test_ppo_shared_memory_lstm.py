"""ppo_shared_memory_lstm.py: a short run with 2 workers (files, metrics, every worker's episodes, ratio
1), no bootstrap on a step both terminated and truncated, the recurrent chunks (saved states, resets
inside a chunk, chunk and minibatch indexing), bad input, and what happens when a worker raises, is killed or
stops answering (--worker-timeout), when a worker's slice is not what it wrote, when the learner gets Ctrl-C or is
killed, when the file system refuses a checkpoint, the TensorBoard events or the shared memory: a bounded stop, no
process and no shared memory left."""

import os
import re
import resource
import signal
import subprocess
import time
from pathlib import Path

import gymnasium as gym
import multiprocessing as mp
import numpy as np
import pytest
import torch

import ppo_shared_memory_lstm as script
import ppolab.processes
from helpers import (
    LINE,
    METRICS,
    assert_evaluation_videos,
    assert_progress_lines,
    check_resume_after_interruption,
    descendants,
    ended,
    load,
    only_run_dir,
    read_scalars,
    run_script,
    running,
    script_command,
    start_script,
)

pytestmark = pytest.mark.exclusive  # worker timeouts; checks that nothing is left in /dev/shm

NAME = "ppo_shared_memory_lstm"
WORKERS, ENVS_PER_WORKER, STEPS = 2, 2, 32
BATCH, ITERATIONS = WORKERS * ENVS_PER_WORKER * STEPS, 3
SMALL = (
    "--num-workers",
    WORKERS,
    "--num-envs-per-worker",
    ENVS_PER_WORKER,
    "--num-steps",
    STEPS,
    "--seq-len",
    8,
    "--num-minibatches",
    2,
    "--update-epochs",
    2,
)
# this script also times the publication of the weights and the workers' split of the rollout
EXPECTED_METRICS = METRICS + [
    "charts/experience_SPS",
    "charts/learning_SPS",
    "perf/publish_time",
]


# PROCESSES AND SHARED MEMORY ---------------------------------------------------------------------


def is_worker(pid: int) -> bool:
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def torch_shm() -> set[str]:
    """PyTorch's shared-memory segments that have a name in /dev/shm (file_system strategy, or leaks)."""
    return {p.name for p in Path("/dev/shm").glob("torch_*")}


def interrupted_run(cwd, action, *argv):
    """Starts a long run of the script with 2 workers, waits until its first checkpoint (an iteration
    done, so the workers are at work), does `action(learner_pid, worker_pids)` (None: nothing), and
    waits at most 30 s for the learner to end. Returns (returncode, stderr, the worker pids); leaves
    nothing running even when the test fails."""
    shm_before = torch_shm()
    proc = start_script(NAME, *SMALL, "--total-timesteps", 10**7, "--checkpoint-every", 1, *argv, cwd=cwd)
    return watched(proc, cwd, action, shm_before)


def run_under_a_file_size_limit(cwd, limit: int, *argv):
    """The script (its whole command line in `argv`) under a file-size limit, as `ulimit -f` sets it: the
    kernel refuses a write past `limit` bytes (EFBIG; Python ignores SIGXFSZ), the workers' too, and
    PyTorch's shared memory is files in /dev/shm, limited alike. Returns what `interrupted_run` does."""

    def limit_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    shm_before = torch_shm()
    proc = subprocess.Popen(
        script_command(NAME, *argv),
        cwd=cwd,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit_files,
    )
    return watched(proc, cwd, None, shm_before)


def watched(proc: subprocess.Popen, cwd, action, shm_before: set[str]):
    """Watches the learner `proc` and every process it starts until its first checkpoint or its end, does
    `action` (see interrupted_run), waits at most 30 s for the learner to end and 10 s more for every
    process it started; checks that none is left and nothing in /dev/shm. Kills what is left if the test
    fails."""
    seen, workers = set(), set()
    try:
        deadline = time.monotonic() + 120
        while True:
            now = descendants(proc.pid)
            # asked again on every pass while it lives: between its fork and its exec a spawned worker
            # still shows the learner's command line
            workers |= {(start, pid) for pid, start in now if (start, pid) not in workers and is_worker(pid)}
            seen |= now
            if proc.poll() is not None or list(Path(cwd).glob("runs/*/checkpoint.pt")):
                break
            assert time.monotonic() < deadline, "no iteration finished in 120 s"
            time.sleep(0.05)
        worker_pids = [pid for _, pid in sorted(workers)]
        if action is not None:
            action(proc.pid, worker_pids)
        _, stderr = ended(proc, 30)
        # the workers and multiprocessing's resource tracker end with the learner (a moment for the tracker)
        deadline = time.monotonic() + 10
        while running(seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(seen), running(seen)
        assert torch_shm() <= shm_before
        return proc.returncode, stderr, worker_pids
    finally:
        for pid, _ in running(seen | {(proc.pid, 0)}) | {(proc.pid, 0)}:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait()


# A SHORT RUN -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    """One short run from the command line with 2 workers x 2 CartPoles, shared by the tests below."""
    cwd = tmp_path_factory.mktemp("shared_memory_lstm")
    shm_before = torch_shm()
    result = run_script(
        NAME,
        *SMALL,
        "--total-timesteps",
        ITERATIONS * BATCH,
        "--save-model",
        "--eval-episodes",
        2,
        "--checkpoint-every",
        1,
        cwd=cwd,
    )
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(cwd / "runs")
    return dict(cwd=cwd, result=result, run_dir=run_dir, scalars=read_scalars(run_dir), shm_before=shm_before)


def test_run_writes_its_files_metrics_and_stdout(e2e):
    result, scalars = e2e["result"], e2e["scalars"]
    assert "Traceback" not in result.stderr
    assert re.search(
        r"^shared memory: rollout buffer [\d.]+ MiB, weights [\d.]+ MiB; 2 workers x 2 envs$", result.stdout, re.M
    )
    checkpoint = load(e2e["run_dir"] / "checkpoint.pt")
    assert checkpoint["global_step"] == ITERATIONS * BATCH
    assert set(checkpoint["rng"]) == {"torch", "numpy", "python"}  # a dict, without CUDA's on the CPU
    assert load(e2e["run_dir"] / "model.pt")["iteration"] == ITERATIONS
    assert not [tag for tag in EXPECTED_METRICS if tag not in scalars]
    for tag in EXPECTED_METRICS:
        if not tag.startswith("charts/episodic"):
            assert [step for step, _ in scalars[tag]] == [BATCH * k for k in range(1, ITERATIONS + 1)], tag
    assert len(scalars["eval/episodic_return"]) == 2
    assert re.search(r"^evaluation: 2 episodes, mean return [\d.]+ \+- [\d.]+$", result.stdout, re.M)
    assert_progress_lines(result.stdout, LINE, scalars["charts/episodic_return"], ITERATIONS, BATCH)
    assert torch_shm() <= e2e["shm_before"]  # nothing left in /dev/shm


def test_first_minibatch_replays_the_workers_rollouts(e2e):
    deviations = [value for _, value in e2e["scalars"]["debug/first_minibatch_ratio_deviation"]]
    assert len(deviations) == ITERATIONS and max(deviations) < 1e-5


def test_episodes_of_every_worker_are_logged_at_their_own_steps(e2e):
    """An episode of environment i (0..3; worker i // 2) that ends at vector step t of an iteration is
    logged at step (iteration start) + t * 4 + i + 1, so its step tells its environment: all appear,
    and CartPole's random-policy episodes of about 20 steps fit the steps between them."""
    steps = [step for step, _ in e2e["scalars"]["charts/episodic_return"]]
    envs = WORKERS * ENVS_PER_WORKER
    assert {(step - 1) % envs for step in steps} == set(range(envs))
    for i in range(envs):
        ends = [(step - 1) // envs for step in steps if (step - 1) % envs == i]
        lengths = [value for step, value in e2e["scalars"]["charts/episodic_length"] if (step - 1) % envs == i]
        assert ends[0] + 1 == lengths[0]  # the first episode of each env started at step 0
        assert np.diff(ends).tolist() == lengths[1:]  # and each later one right after the one before


def test_saved_model_evaluates_as_after_training(e2e):
    logged = [value for _, value in e2e["scalars"]["eval/episodic_return"]]
    returns = script.main(script.Args(evaluate=str(e2e["run_dir"] / "model.pt"), eval_episodes=2, cuda=False))
    assert returns == pytest.approx(logged, rel=1e-6)


def test_run_interrupted_and_resumed_ends_like_an_uninterrupted_one(tmp_path, monkeypatch):
    """In this process (the learner), so the interruption is a KeyboardInterrupt right after a checkpoint:
    the worker is stopped, and the resumed run starts a new one."""

    def make_args(folder):
        return script.Args(
            runs_dir=str(tmp_path / folder),
            num_workers=1,
            num_envs_per_worker=2,
            num_steps=16,
            seq_len=8,
            num_minibatches=2,
            update_epochs=1,
            total_timesteps=4 * 32,
            checkpoint_every=1,
            save_model=True,
            eval_episodes=1,
        )

    check_resume_after_interruption(script, make_args, 4, 32, monkeypatch)
    assert not [pid for pid, _ in descendants(os.getpid()) if is_worker(pid)]


# RECURRENT CHUNKS --------------------------------------------------------------------------------


def test_to_chunks_and_minibatches_index_whole_chunks():
    T, N, L = 12, 3, 4
    x = torch.arange(T * N).reshape(T, N) * 10  # x[t, n] = (t * N + n) * 10
    chunks = script.to_chunks(x.unsqueeze(-1).repeat(1, 1, 2), L)
    assert chunks.shape == (L, T // L * N, 2)
    for i in range(L):
        for c in range(T // L * N):  # chunk c = k * N + n: steps k * L ... k * L + L - 1 of env n
            k, n = divmod(c, N)
            assert chunks[i, c].tolist() == [x[k * L + i, n].item()] * 2
    states = torch.arange(T // L * N).reshape(T // L, N, 1)  # chunk_h[k, n]
    assert states.reshape(1, -1, 1)[0, :, 0].tolist() == list(range(T // L * N))  # same c
    minibatches = script.chunk_minibatches(9, 3, torch.device("cpu"))
    assert [len(mb) for mb in minibatches] == [3, 3, 3]
    assert sorted(torch.cat(minibatches).tolist()) == list(range(9))


@pytest.fixture
def worker_rollout():
    """Worker 1 of 2 (3 envs each) collects 12 steps of FixedLength-v0 (episodes of exactly 3 steps, so
    episodes start at steps 0, 3, 6, 9: inside the 4-step chunks) into its slice of a shared buffer."""
    torch.manual_seed(0)
    args = script.Args(env_id="FixedLength-v0", num_workers=2, num_envs_per_worker=3, num_steps=12, seq_len=4)
    envs = script.make_envs(args, 3, "")
    agent = script.Agent(envs.single_observation_space.shape, int(envs.single_action_space.n))
    buffer = script.allocate_shared_buffer(
        args, envs.single_observation_space.shape, torch.float32, agent.lstm.hidden_size
    )
    rollout = {name: x[:, 3:6] for name, x in buffer.items()}
    next_obs, _ = envs.reset(seed=0)
    # a nonzero carried-in state, as after an earlier rollout
    H = agent.lstm.hidden_size  # the actor's and the critic's LSTM, side by side
    carry = (next_obs, np.zeros(3, dtype=np.float32), (torch.randn(1, 3, H), torch.randn(1, 3, H)))
    carry, episodes = script.collect_rollout(agent, envs, rollout, carry, args, first_step=0, first_env=3)
    envs.close()
    return dict(args=args, agent=agent, buffer=buffer, episodes=episodes, state=carry[2])


def test_rollout_fills_its_own_slice_with_episode_starts_inside_chunks(worker_rollout):
    buffer = worker_rollout["buffer"]
    for name, x in buffer.items():  # worker 0's columns are untouched
        assert not x[:, :3].any(), name
    assert buffer["starts"][:, 3:].tolist() == [[float(t % 3 == 0 and t > 0)] * 3 for t in range(12)]
    assert buffer["obs"][:, 3:, 0].tolist() == [[float(t % 3)] * 3 for t in range(12)]
    assert buffer["dones"][:, 3:].tolist() == [[float(t % 3 == 2)] * 3 for t in range(12)]
    # env i of the slice (batch index 3 + i of 6) ending at step t: global step t * 6 + 3 + i + 1
    assert worker_rollout["episodes"] == [
        script.Episode(step=t * 6 + 3 + i + 1, episodic_return=3.0, episodic_length=3)
        for t in (2, 5, 8, 11)
        for i in range(3)
    ]


def test_chunks_replayed_from_their_saved_states_give_the_rollout(worker_rollout):
    """The update's view: every chunk run from its saved start state reproduces the worker's
    log-probs and values (ratio 1), and ends in the state the next chunk was saved with."""
    args, agent, buffer = worker_rollout["args"], worker_rollout["agent"], worker_rollout["buffer"]
    own = {name: x[:, 3:] for name, x in buffer.items()}
    c = {name: script.to_chunks(own[name], args.seq_len) for name in ("obs", "starts", "actions", "logprobs", "values")}
    H = agent.lstm.hidden_size
    h0, c0 = own["chunk_h"].reshape(1, -1, H), own["chunk_c"].reshape(1, -1, H)
    assert h0[:, :3].abs().sum() > 0  # chunk 0 starts from the carried-in (nonzero) state
    with torch.no_grad():
        _, logprob, _, value, (h, c_) = agent.get_action_and_value(c["obs"], c["starts"], (h0, c0), c["actions"])
    torch.testing.assert_close(logprob, c["logprobs"], rtol=0, atol=1e-6)
    torch.testing.assert_close(value, c["values"], rtol=0, atol=1e-6)
    # chunk k = 0, 1 of env n ends in the state saved at the start of chunk k + 1 (chunk index (k + 1) * 3 + n)
    torch.testing.assert_close(h[:, :6], h0[:, 3:], rtol=0, atol=1e-6)
    torch.testing.assert_close(c_[:, :6], c0[:, 3:], rtol=0, atol=1e-6)
    torch.testing.assert_close(h[:, 6:], worker_rollout["state"][0], rtol=0, atol=1e-6)  # the carry to the next rollout


def test_state_is_reset_where_an_episode_starts_inside_a_chunk(worker_rollout):
    """Chunk 1 (steps 4-7) has an episode start at step 6: from there on the outputs do not depend on the
    state the chunk starts with; before it they do."""
    agent, buffer = worker_rollout["agent"], worker_rollout["buffer"]
    own = {name: x[:, 3:] for name, x in buffer.items()}
    obs, starts = script.to_chunks(own["obs"], 4)[:, 3:6], script.to_chunks(own["starts"], 4)[:, 3:6]
    with torch.no_grad():
        out_a, _ = agent.get_states(obs, starts, (own["chunk_h"][1:2], own["chunk_c"][1:2]))
        H = agent.lstm.hidden_size
        out_b, _ = agent.get_states(obs, starts, (torch.randn(1, 3, H), torch.randn(1, 3, H)))
    assert starts[:, 0].tolist() == [0, 0, 1, 0]
    torch.testing.assert_close(out_a[2:], out_b[2:])
    assert not torch.allclose(out_a[:2], out_b[:2])


def test_only_environment_0_records_video(tmp_path):
    """make_env(env_id, idx, capture_video, run_dir, *, extras) as in the other scripts: with capture_video
    the vector environment's environment 0 records, the others do not; the extras apply to all."""

    def records(env: gym.Env) -> bool:
        while isinstance(env, gym.Wrapper):
            if isinstance(env, gym.wrappers.RecordVideo):
                return True
            env = env.env
        return False

    envs = [script.make_env("CartPole-v1", idx, True, str(tmp_path), hide_velocity=True)() for idx in (0, 1)]
    assert [records(env) for env in envs] == [True, False]
    assert [env.observation_space.shape for env in envs] == [(2,), (2,)]
    for env in envs:
        env.close()


def test_atari_rollout_keeps_uint8_frames_and_replays():
    """Pong through the Atari wrappers: one 84x84 uint8 frame per step in the buffer, CNN + LSTM(512, 128),
    and the replay from the saved chunk states gives the rollout's log-probs."""
    torch.manual_seed(0)
    args = script.Args(env_id="Pong", num_workers=1, num_envs_per_worker=2, num_steps=8, seq_len=4)
    envs = script.make_envs(args, 2, "")
    agent = script.Agent(envs.single_observation_space.shape, int(envs.single_action_space.n))
    buffer = script.allocate_shared_buffer(args, envs.single_observation_space.shape, torch.uint8, 128)
    next_obs, _ = envs.reset(seed=0)
    carry = (next_obs, np.ones(2, dtype=np.float32), agent.initial_state(2, torch.device("cpu")))
    script.collect_rollout(agent, envs, buffer, carry, args, first_step=0, first_env=0)
    envs.close()
    assert buffer["obs"].shape == (8, 2, 1, 84, 84) and buffer["obs"].dtype == torch.uint8 and buffer["obs"].any()
    c = {name: script.to_chunks(buffer[name], 4) for name in ("obs", "starts", "actions", "logprobs")}
    state = (buffer["chunk_h"].reshape(1, -1, 128), buffer["chunk_c"].reshape(1, -1, 128))
    with torch.no_grad():
        _, logprob, _, _, _ = agent.get_action_and_value(c["obs"], c["starts"], state, c["actions"])
    torch.testing.assert_close(logprob, c["logprobs"], rtol=0, atol=1e-5)


def test_atari_run_with_workers_from_the_command_line(tmp_path):
    """Breakout with 2 workers x 2 games for 2 iterations, as a user runs it: the CNN + LSTM learner
    replays the workers' uint8 rollouts exactly (ratio 1; the slices' checksums matched, or the run would
    have stopped)."""
    result = run_script(
        NAME,
        "--env-id",
        "Breakout",
        "--num-workers",
        2,
        "--num-envs-per-worker",
        2,
        "--num-steps",
        32,
        "--seq-len",
        16,
        "--num-minibatches",
        2,
        "--update-epochs",
        1,
        "--total-timesteps",
        2 * 128,
        "--max-episode-steps",
        20,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    # 2 x 32 x 4 frames of 84 x 84 bytes (uint8), plus the rest of the buffer
    size = float(re.search(r"shared memory: rollout buffer ([\d.]+) MiB", result.stdout)[1])
    assert 4 * 32 * 84 * 84 / 2**20 < size < 4 * 32 * 84 * 84 * 1.5 / 2**20
    scalars = read_scalars(only_run_dir(tmp_path / "runs"))
    assert max(value for _, value in scalars["debug/first_minibatch_ratio_deviation"]) < 1e-5
    assert scalars["charts/episodic_return"]  # games cut at 20 steps ended and were logged


@pytest.mark.parametrize("obs_shape", [(1, 84, 84), (4,)])
def test_weights_a_worker_loads_are_the_learners(obs_shape):
    learner, worker = script.Agent(obs_shape, 3), script.Agent(obs_shape, 3)  # two different initialisations
    weights = torch.zeros(sum(p.numel() for p in learner.parameters()))
    script.publish_weights(learner, weights)
    script.load_weights(worker, weights)
    for (name, a), b in zip(learner.named_parameters(), worker.parameters()):
        assert torch.equal(a, b), name


def test_slice_checksum_sees_a_change_in_its_slice_only():
    args = script.Args(num_workers=2, num_envs_per_worker=2, num_steps=8, seq_len=4)
    buffer = script.allocate_shared_buffer(args, (4,), torch.float32, 8)
    for x in buffer.values():
        x.copy_(torch.randint(0, 100, x.shape))
    worker0, worker1 = script.slice_checksum(buffer, 0, 2), script.slice_checksum(buffer, 2, 4)
    for name in buffer:
        buffer[name][-1, 3].view(-1)[0] += 1  # one number of worker 1's slice
        assert script.slice_checksum(buffer, 0, 2) == worker0, name
        assert script.slice_checksum(buffer, 2, 4) != worker1, name
        buffer[name][-1, 3].view(-1)[0] -= 1
    assert script.slice_checksum(buffer, 2, 4) == worker1


# BAD INPUT ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_steps=32, seq_len=12), "--seq-len 12 does not divide --num-steps 32"),
        (
            dict(num_workers=3, num_envs_per_worker=1, num_steps=16, seq_len=16, num_minibatches=2),
            "--num-minibatches 2 does not divide the 3 chunks",
        ),
        (dict(env_id="Pendulum-v1"), "supports Discrete actions only"),
        (dict(env_id="NoSuchEnv-v0"), "unknown environment id 'NoSuchEnv-v0'"),
        (dict(env_id="Acrobot-v1", hide_velocity=True), "--hide-velocity is for CartPole only"),
    ],
)
def test_bad_input_gets_one_line_and_exit_code_2(overrides, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.main(script.Args(runs_dir=str(tmp_path), **overrides))
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert message in line and "error" in line
    assert not list(tmp_path.iterdir())  # before any work: not even a run folder


def test_bad_input_on_the_command_line_exits_before_starting_workers(tmp_path):
    result = run_script(NAME, "--num-steps", 100, "--seq-len", 16, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line == f"{NAME}.py: error: --seq-len 16 does not divide --num-steps 100 (the rollout is cut into chunks)"


# FAILURES ----------------------------------------------------------------------------------------


def resume_words(cwd) -> str:
    """What a failed run's line ends with: its last checkpoint and the command that resumes it."""
    (path,) = Path(cwd).glob("runs/*/checkpoint.pt")
    path = path.relative_to(cwd)
    return f"last checkpoint {path}; continue with: python {script_command(NAME)[1]} --resume {path}"


def test_worker_that_raises_stops_the_run(tmp_path):
    returncode, stderr, workers = interrupted_run(tmp_path, None, "--env-id", "tests.crashing_envs:CrashingCartPole-v0")
    assert len(workers) == WORKERS
    assert returncode == 1
    assert "RuntimeError: injected failure after 40 steps" in stderr  # the worker's traceback
    assert stderr.strip().splitlines()[-1] == (
        f"{NAME}.py: error: rollout worker 1 failed: RuntimeError: injected failure after 40 steps "
        f"(its traceback is above); stopped all workers; {resume_words(tmp_path)}"
    )


def test_worker_killed_stops_the_run(tmp_path):
    returncode, stderr, workers = interrupted_run(
        tmp_path, lambda learner, workers: os.kill(workers[1], signal.SIGKILL)
    )
    assert len(workers) == WORKERS
    assert returncode == 1
    assert stderr.strip().splitlines()[-1] == (
        f"{NAME}.py: error: rollout worker 1 (pid {workers[1]}) died (signal SIGKILL); stopped all workers; "
        + resume_words(tmp_path)
    )


def test_a_worker_that_stops_answering_ends_the_run_after_the_worker_timeout(tmp_path):
    """A worker stopped (SIGSTOP: as one stuck in its environment's step or in a deadlock looks to the learner)
    ends the run once it has sent nothing for --worker-timeout seconds: one line naming it, with the last
    checkpoint and the command that resumes it, exit 1; the stopped worker is ended too, and nothing is left in
    /dev/shm (interrupted_run checks both)."""
    timeout, stopped = 10, []

    def stop_worker(learner, workers):
        os.kill(workers[1], signal.SIGSTOP)
        stopped.append(time.monotonic())

    returncode, stderr, workers = interrupted_run(tmp_path, stop_worker, "--worker-timeout", timeout)
    assert time.monotonic() - stopped[0] < timeout + 20  # (interrupted_run has waited for every process too)
    assert returncode == 1
    (line,) = stderr.splitlines()
    assert line == (
        f"{NAME}.py: error: rollout worker 1 (pid {workers[1]}) sent nothing for {timeout} s (stopped, or stuck: in "
        f"a step of its environment, a deadlock); stopped all workers; {resume_words(tmp_path)}"
    )


def test_waiting_for_each_process_ends_after_the_timeout_but_not_before():
    """ppolab.processes.receive_from_each: a child that answers within the timeout is heard, one that answers
    after it is given up on (None) once the timeout is up; how_it_ended says it is alive and silent."""
    context = mp.get_context("fork")
    children, conns = [], []
    for delay in (0.2, 30):
        parent_end, child_end = context.Pipe()
        child = context.Process(target=answer_after, args=(child_end, delay), daemon=True)
        child.start()
        children.append(child)
        conns.append(parent_end)
    try:
        start = time.monotonic()
        heard = list(ppolab.processes.receive_from_each(children, conns, timeout=2.0))
        waited = time.monotonic() - start
        assert heard == [(0, "done"), (1, None)] and 2.0 <= waited < 5.0
        assert ppolab.processes.how_it_ended(children[1], 2.0).startswith("sent nothing for 2 s (stopped, or stuck")
    finally:
        ppolab.processes.end_processes(children, grace=0.0)
    assert ppolab.processes.how_it_ended(children[1]) == "died (signal SIGTERM)"


def answer_after(conn, delay: float):
    time.sleep(delay)
    conn.send("done")


def test_a_slice_that_is_not_what_its_worker_wrote_stops_the_run(tmp_path, monkeypatch):
    """The learner computes another checksum of worker 1's slice than the worker reported (as if the slice
    had changed after the worker's Done): one line naming the worker and the iteration, exit code 1 (a
    string SystemExit), every worker stopped, and no update trained on the batch."""
    real_checksum, updates = script.slice_checksum, []
    monkeypatch.setattr(
        script, "slice_checksum", lambda buffer, lo, hi: real_checksum(buffer, lo, hi) + (lo == ENVS_PER_WORKER)
    )
    monkeypatch.setattr(script, "compute_gae", lambda **kwargs: updates.append(kwargs))
    with pytest.raises(SystemExit) as exit_info:
        script.main(
            script.Args(
                runs_dir=str(tmp_path),
                num_workers=WORKERS,
                num_envs_per_worker=ENVS_PER_WORKER,
                num_steps=16,
                seq_len=8,
                num_minibatches=2,
                update_epochs=1,
                total_timesteps=2 * 64,
            )
        )
    assert re.fullmatch(
        r"\S+: error: rollout worker 1: its slice of the rollout buffer in iteration 1 is not what it "
        r"wrote \(checksum mismatch\); stopped all workers; no checkpoint in \S+ \(--checkpoint-every N writes one "
        r"every N iterations\)",
        exit_info.value.code,
    )
    assert updates == []
    assert not [tag for tag in read_scalars(only_run_dir(tmp_path)) if tag.startswith("losses/")]
    assert not [pid for pid, _ in descendants(os.getpid()) if is_worker(pid)]


@pytest.mark.parametrize("signum, said", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated (SIGTERM)")])
def test_ctrl_c_and_sigterm_stop_the_learner_and_every_worker(tmp_path, signum, said):
    """Ctrl-C, and SIGTERM (what schedulers send first) alike: the learner's one line with the resume command,
    exit 128 + the signal's number, every worker and /dev/shm file gone."""
    returncode, stderr, workers = interrupted_run(tmp_path, lambda learner, workers: os.kill(learner, signum))
    assert len(workers) == WORKERS
    assert returncode == 128 + signum
    (line,) = stderr.splitlines()  # the learner's line; the workers are quiet
    assert re.fullmatch(
        rf"{NAME}.py: {re.escape(said)}: last checkpoint runs/\S+/checkpoint.pt; continue with: python "
        rf"\S+{NAME}.py --resume runs/\S+/checkpoint.pt",
        line,
    )


def test_workers_end_by_themselves_when_the_learner_is_killed(tmp_path):
    returncode, _, workers = interrupted_run(tmp_path, lambda learner, workers: os.kill(learner, signal.SIGKILL))
    assert len(workers) == WORKERS
    assert returncode == -signal.SIGKILL  # and interrupted_run saw every worker end (within 10 s)


# A full disk: a write the file system refuses ends the run in one line (as in every script) and stops every
# worker. PyTorch's shared memory is files in /dev/shm, so a file-size limit refuses them too: the weights are
# the largest (CartPole's towers and LSTMs), the checkpoint (weights, Adam's moments, ...) about three times
# as large, so a limit between them refuses the checkpoint and nothing before it
WEIGHTS_BYTES = 4 * sum(p.numel() for p in script.Agent((4,), 2).parameters())
NO_CHECKPOINT = "no checkpoint in {run_dir} (--checkpoint-every N writes one every N iterations)"


def refused_write(tmp_path, limit: int, *argv) -> tuple[str, Path, list[int]]:
    """A run under the file-size limit that ends in exit code 1: its one line on stderr, its run folder (as
    the line names it) and its workers' pids."""
    returncode, stderr, workers = run_under_a_file_size_limit(tmp_path, limit, *argv)
    assert returncode == 1, stderr
    (line,) = stderr.splitlines()  # the learner's line; the workers are quiet
    return line, only_run_dir(tmp_path / "runs").relative_to(tmp_path), workers


def test_a_refused_checkpoint_ends_the_run_in_one_line_and_stops_every_worker(tmp_path):
    limit = 500_000
    assert WEIGHTS_BYTES < limit
    line, run_dir, workers = refused_write(tmp_path, limit, *SMALL, "--total-timesteps", 10**7, "--checkpoint-every", 1)
    assert len(workers) == WORKERS
    assert (
        line
        == f"{NAME}.py: error: cannot write {run_dir}/checkpoint.pt: File too large; no checkpoint in {run_dir} yet"
    )
    assert [p.name for p in (tmp_path / run_dir).iterdir() if not p.name.startswith("events.")] == []  # no .tmp


def test_refused_tensorboard_events_end_the_run_in_one_line_and_stop_every_worker(tmp_path):
    """Episodes of 3 steps, logged each: the events file outgrows a limit above the shared memory's files."""
    limit = 320_000
    assert WEIGHTS_BYTES < limit
    line, run_dir, workers = refused_write(
        tmp_path,
        limit,
        "--env-id",
        "tests.fake_envs:FixedLength-v0",
        "--num-workers",
        WORKERS,
        "--num-envs-per-worker",
        4,
        "--num-steps",
        128,
        "--update-epochs",
        1,
        "--total-timesteps",
        10**7,
    )
    assert len(workers) == WORKERS
    assert line == (
        f"{NAME}.py: error: cannot write the TensorBoard events in {run_dir}: File too large; "
        + NO_CHECKPOINT.format(run_dir=run_dir)
    )
    (events,) = (tmp_path / run_dir).iterdir()
    assert events.name.startswith("events.") and events.stat().st_size <= limit


def test_refused_shared_memory_ends_the_run_in_one_line_before_any_worker_starts(tmp_path):
    limit = 150_000
    assert WEIGHTS_BYTES > limit
    line, run_dir, workers = refused_write(tmp_path, limit, *SMALL, "--total-timesteps", 10**7)
    assert workers == []
    assert line == (
        f"{NAME}.py: error: cannot write the weights in /dev/shm ({WEIGHTS_BYTES / 2**20:.2f} MiB): "
        "File too large; " + NO_CHECKPOINT.format(run_dir=run_dir)
    )


def test_classic_control_actor_and_critic_towers_are_separate():
    """The value's gradient reaches only the critic's tower and head, the policy's only the actor's."""
    torch.manual_seed(0)
    agent = script.Agent((4,), 2)
    obs, starts = torch.randn(5, 3, 4), torch.zeros(5, 3)
    _, logprob, _, value, _ = agent.get_action_and_value(obs, starts, agent.initial_state(3, torch.device("cpu")))
    actor, critic = ("network.", "lstm.actor.", "actor."), ("critic_network.", "lstm.critic.", "critic.")
    for output, tower in ((value, critic), (logprob, actor)):
        agent.zero_grad(set_to_none=True)
        output.sum().backward(retain_graph=True)
        touched = {name for name, p in agent.named_parameters() if p.grad is not None and p.grad.any()}
        assert {prefix for prefix in tower if any(name.startswith(prefix) for name in touched)} == set(tower)
        assert all(name.startswith(tower) for name in touched), touched


def test_evaluate_capture_video_records_the_first_episode(e2e, capsys):
    assert_evaluation_videos(script, e2e["run_dir"] / "model.pt", 2, 1, capsys)
