"""ppo_continuous_action_redis.py against a real redis-server on a free loopback port: end to end from the
command line, samplers killed and joining, the learner starved, killed or without its server, malformed
and foreign chunks, the chunk accounting (trained + stale == sent, per version), bad --redis-url, an
open server refused (tested with a host under the reserved .invalid domain: no test contacts another
machine), the embedded server on loopback only and without persistence, a refused write ending the
learner, its samplers and its server in one line, a local sampler that dies restarted (and past --max-restarts
ending the learner at once, with a checkpoint), a closed
stdout that stops the printing and not the run, and the wire format's checks. Samplers and learners
run as the commands a user types."""

import importlib
import ipaddress
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import types
import uuid
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import redis

from helpers import (
    LINE,
    METRICS,
    assert_evaluate_flag_matches_training,
    assert_progress_lines,
    descendants,
    load,
    only_run_dir,
    process_table,
    read_scalars,
    run_script,
    running,
    script_command,
)
from ppolab.checkpoints import write_checkpoint_file
from ppolab.redis_server import check_redis_url, open_redis_host, start_redis_server, stop_processes

pytestmark = pytest.mark.exclusive  # samplers killed and restarted under timeouts; the process table

NAME = "ppo_continuous_action_redis"
script = importlib.import_module(NAME)
ENV = "tests.fake_envs:MixedEndsBox-v0"  # 2-d observations and actions, episodes of 5 steps
T, K = 32, 4  # steps per chunk, chunks per update
FAST = ["--env-id", ENV, "--num-steps", T, "--num-chunks", K, "--num-minibatches", 4, "--update-epochs", 2]
FAST_ARGS = dict(env_id=ENV, num_steps=T, num_chunks=K, num_minibatches=4, update_epochs=2)  # FAST, as Args
EXTRA_METRICS = [
    "charts/experience_SPS",
    "charts/learner_SPS",
    "charts/bytes_per_step",
    "charts/samplers_per_update",
    "perf/transfer_time",
    "perf/publish_time",
    "debug/stale_chunks",
    "debug/malformed_chunks",
]


@pytest.fixture(scope="module")
def server():
    """A redis-server on a free loopback port for this file (the script's own way of starting one)."""
    process, url = start_redis_server()
    yield url
    stop_processes([process])
    assert process.poll() is not None


@pytest.fixture
def client(server):
    return redis.Redis.from_url(server)


def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def launch(cwd, label: str, *argv) -> subprocess.Popen:
    """The script as a user starts it, stdout and stderr to files `label`.out/.err (no pipe that a
    surviving child could hold open)."""
    with open(cwd / f"{label}.out", "w") as out, open(cwd / f"{label}.err", "w") as err:
        return subprocess.Popen(
            script_command(NAME, *argv), cwd=cwd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=out, stderr=err
        )


def output(cwd, label: str) -> tuple[str, str]:
    return (cwd / f"{label}.out").read_text(), (cwd / f"{label}.err").read_text()


def wait_watching(process: subprocess.Popen, timeout: float) -> set[tuple[int, int]]:
    """Waits for `process` to end, noting every process it had below it meanwhile."""
    seen, deadline = set(), time.monotonic() + timeout
    while process.poll() is None:
        seen |= descendants(process.pid)
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"still running after {timeout} s")
        time.sleep(0.1)
    return seen


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def counts(client, rid: str, name: str) -> dict[tuple[int, int], int]:
    """The accounting hash `name` (sent, trained, stale): (version, sampler) -> chunks."""
    return {
        tuple(map(int, field.decode().split(":"))): int(value)
        for field, value in client.hgetall(script.key(rid, name)).items()
    }


def per_version(table: dict) -> dict[int, int]:
    totals = {}
    for (version, _), n in table.items():
        totals[version] = totals.get(version, 0) + n
    return totals


def assert_chunks_accounted(client, rid: str, iterations: int):
    """Every update trained on exactly K chunks; per version and sampler, nothing was trained that was not
    sent; per version, trained + stale == sent (the learner drains the queue into stale at the end)."""
    sent, trained, stale = (counts(client, rid, name) for name in ("sent", "trained", "stale"))
    assert per_version(trained) == {v: K for v in range(1, iterations + 1)}
    assert all(n <= sent.get(name, 0) for name, n in trained.items())
    for version, n in per_version(sent).items():
        assert per_version(trained).get(version, 0) + per_version(stale).get(version, 0) == n, version


def total_trained(client, rid) -> int:
    return sum(counts(client, rid, "trained").values())


def assert_every_key_expires(client, rid: str):
    """Every key the run `rid` left on the server expires, within RUN_TTL: none stays there for ever."""
    left = {name.decode(): client.ttl(name) for name in client.scan_iter(match=script.key(rid, "*"))}
    assert left and all(0 < ttl <= script.RUN_TTL for ttl in left.values()), left


# END TO END ---------------------------------------------------------------------------------------


def test_end_to_end_with_two_local_samplers(tmp_path):
    iterations = 12  # enough for both samplers to feed an update, even when one starts seconds later
    learner = launch(
        tmp_path,
        "learner",
        *FAST,
        "--num-samplers",
        2,
        "--total-timesteps",
        iterations * T * K,
        "--save-model",
        "--eval-episodes",
        2,
        "--checkpoint-every",
        2,
    )
    seen = wait_watching(learner, 120)
    stdout, stderr = output(tmp_path, "learner")
    assert learner.returncode == 0, stderr
    assert len(seen) >= 3  # the server and two samplers were there
    assert not running(seen), "a process of the run is left"
    run_dir = only_run_dir(tmp_path / "runs")
    assert {"checkpoint.pt", "model.pt"} <= {p.name for p in run_dir.iterdir()}
    assert any(p.name.startswith("events.out.tfevents") for p in run_dir.iterdir())
    scalars = read_scalars(run_dir)
    for tag in METRICS + EXTRA_METRICS:
        assert tag in scalars, tag
    assert max(v for _, v in scalars["debug/first_minibatch_ratio_deviation"]) < 1e-5
    assert 2 in [v for _, v in scalars["charts/samplers_per_update"]]
    # every episode logged once, at its own step: 5 steps each, so a sampler that stepped S steps ended
    # S // 5 of them; 3 where the episode terminated, 4 where it was only truncated
    returns = scalars["charts/episodic_return"]
    assert iterations * T * K // 5 - 1 <= len(returns) <= iterations * T * K // 5
    assert {v for _, v in returns} == {3.0, 4.0}
    assert {v for _, v in scalars["charts/episodic_length"]} == {5.0}
    assert_progress_lines(stdout, LINE, returns, iterations, T * K)
    assert "samplers 2)" in stdout
    e2e = dict(result=types.SimpleNamespace(stdout=stdout), run_dir=run_dir, cwd=tmp_path)
    assert_evaluate_flag_matches_training(NAME, e2e, 2)


# ELASTIC SAMPLERS ---------------------------------------------------------------------------------


def test_killed_samplers_lose_nothing_and_later_ones_join(tmp_path, server, client):
    """Samplers A and B; B killed with SIGKILL mid-run: A carries on. Then A killed too and C and D,
    started later, finish the run: both contribute. Nothing trained that a sampler did not send."""
    rid, iterations = run_id(), 50
    learner = launch(
        tmp_path,
        "learner",
        *FAST,
        "--redis-url",
        server,
        "--run-id",
        rid,
        "--num-samplers",
        0,
        "--total-timesteps",
        iterations * T * K,
        "--sampler-timeout",
        30,
    )
    sampler = ["--role", "sampler", "--redis-url", server, "--run-id", rid]
    processes = [learner, launch(tmp_path, "a", *sampler), launch(tmp_path, "b", *sampler)]
    try:
        wait_until(lambda: len({s for _, s in counts(client, rid, "sent")}) == 2, 60, "A and B to send chunks")
        processes[2].send_signal(signal.SIGKILL)
        at_kill = total_trained(client, rid)
        wait_until(lambda: total_trained(client, rid) >= at_kill + 2 * K, 30, "A alone to carry on")
        processes[1].send_signal(signal.SIGKILL)
        processes += [launch(tmp_path, "c", *sampler), launch(tmp_path, "d", *sampler)]
        wait_watching(learner, 120)
        assert learner.returncode == 0, output(tmp_path, "learner")[1]
        for late in processes[3:]:  # they exit by themselves when the run ends
            late.wait(15)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert_chunks_accounted(client, rid, iterations)
    trained = counts(client, rid, "trained")
    assert {sampler_id for _, sampler_id in trained} == {1, 2, 3, 4}  # A and B, then C and D, in joining order
    # C and D both fed some updates, and every update's samplers_per_update counts the samplers whose
    # chunks it trained on (A's last chunk, sent just before its kill, may share an update with C and D)
    assert any((v, 3) in trained and (v, 4) in trained for v in range(1, iterations + 1))
    samplers_per_update = [v for _, v in read_scalars(only_run_dir(tmp_path / "runs"))["charts/samplers_per_update"]]
    assert samplers_per_update == [len({s for version, s in trained if version == v}) for v in range(1, iterations + 1)]


def test_a_resume_uses_the_server_and_run_id_of_its_own_command_line(tmp_path):
    """`--resume` reads the run's arguments from the checkpoint, except the server and the run id: the saved URL
    has its password redacted (redis://:***@...) and the run id is the old learner's. A resume that named
    neither trains with its own server and a fresh run id."""
    fields = dict(FAST_ARGS, total_timesteps=2 * T * K, checkpoint_every=1, num_samplers=1, cuda=False)
    path = Path(script.main(script.Args(**fields, runs_dir=str(tmp_path / "runs")))) / "checkpoint.pt"
    checkpoint = load(path)
    checkpoint["args"].update(redis_url="redis://:***@lab.invalid:6379/0", run_id="the-old-learner")
    write_checkpoint_file(checkpoint, str(path))
    result = run_script(NAME, "--resume", path, "--total-timesteps", 3 * T * K, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "on redis://127.0.0.1:" in result.stdout and "the-old-learner" not in result.stdout
    assert load(path)["global_step"] == 3 * T * K


# THE LEARNER ALONE, KILLED, OR WITHOUT ITS SERVER -------------------------------------------------


@pytest.mark.parametrize("case", ["lab_server", "embedded_server", "server_killed"])
def test_learner_ends_with_one_line_and_leaves_no_process(tmp_path, server, case):
    """No sampler for --sampler-timeout seconds, or the server gone: one line naming the problem, exit 1,
    in bounded time; the embedded server is stopped."""
    argv = [*FAST, "--num-samplers", 0, "--total-timesteps", 10 * T * K]
    argv += ["--redis-url", server] if case == "lab_server" else []
    argv += ["--sampler-timeout", 60 if case == "server_killed" else 3]
    learner, start, seen = launch(tmp_path, "learner", *argv), time.monotonic(), set()
    if case == "server_killed":
        wait_until(
            lambda: len(descendants(learner.pid)) == 1 and "samplers join" in output(tmp_path, "learner")[0],
            30,
            "the learner to start its server",
        )
        seen = descendants(learner.pid)
        os.kill(next(iter(seen))[0], signal.SIGKILL)
    seen |= wait_watching(learner, 40)
    assert time.monotonic() - start < 35
    stderr = output(tmp_path, "learner")[1]
    assert learner.returncode == 1, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{NAME}.py: error: "), stderr
    expected = "lost the Redis server" if case == "server_killed" else "no chunk from any sampler for 3 s"
    assert expected in lines[0]
    assert re.search(r"; no checkpoint in runs/\S+ \(--checkpoint-every N writes one every N iterations\)$", lines[0])
    assert len(seen) == (0 if case == "lab_server" else 1) and not running(seen)


@pytest.mark.parametrize("case", ["lab_server", "embedded_server"])
def test_samplers_exit_by_themselves_when_the_learner_dies(tmp_path, server, client, case):
    """SIGKILL to the learner: samplers started elsewhere see its heartbeat expire, local ones lose the
    embedded server (which dies with the learner); all exit within seconds. On the lab's server every key
    of the run expires: a learner killed leaves nothing there for ever."""
    argv, rid = [*FAST, "--total-timesteps", 10**6], run_id()
    if case == "lab_server":
        learner = launch(tmp_path, "learner", *argv, "--redis-url", server, "--run-id", rid, "--num-samplers", 0)
        samplers = [
            launch(tmp_path, f"s{i}", "--role", "sampler", "--redis-url", server, "--run-id", rid) for i in range(2)
        ]
        wait_until(lambda: total_trained(client, rid) >= 2 * K, 60, "the run to train")
        processes = {(p.pid, process_table()[p.pid][2]) for p in samplers}
    else:
        learner = launch(tmp_path, "learner", *argv, "--num-samplers", 2)
        wait_until(lambda: "iteration 1/" in output(tmp_path, "learner")[0], 60, "the run to train")
        processes = descendants(learner.pid)
        assert len(processes) == 3
    learner.send_signal(signal.SIGKILL)
    learner.wait()
    killed = time.monotonic()
    wait_until(lambda: not running(processes), 15, "the samplers to exit")
    assert time.monotonic() - killed < script.HEARTBEAT_TTL + 5
    if case == "lab_server":
        assert_every_key_expires(client, rid)


# SIGTERM AND A SERVER THAT REFUSES WRITES (issue 32) ----------------------------------------------


def resume_line(tmp_path) -> str:
    """What the learner's line ends with: the run's checkpoint and the command that resumes it."""
    (path,) = tmp_path.glob("runs/*/checkpoint.pt")
    path = path.relative_to(tmp_path)
    return f"last checkpoint {path}; continue with: python {script_command(NAME)[1]} --resume {path}"


@pytest.mark.parametrize("case", ["lab_server", "embedded_server"])
def test_sigterm_ends_the_learner_as_ctrl_c_does(tmp_path, server, client, case):
    """SIGTERM (what schedulers send) to the learner: its one line, exit 143; its local samplers and embedded
    server stopped, quietly; a sampler started elsewhere exits by itself (the run is over); on the lab's server
    the run's keys are gone or expire."""
    rid, argv = run_id(), [*FAST, "--total-timesteps", 10**6, "--checkpoint-every", 1, "--num-samplers"]
    if case == "lab_server":
        learner = launch(tmp_path, "learner", *argv, 1, "--redis-url", server, "--run-id", rid)
        remote = launch(tmp_path, "remote", "--role", "sampler", "--redis-url", server, "--run-id", rid)
    else:
        learner, remote = launch(tmp_path, "learner", *argv, 2), None
    try:
        wait_until(lambda: list(tmp_path.glob("runs/*/checkpoint.pt")), 90, "the first checkpoint")
        seen = descendants(learner.pid)
        learner.send_signal(signal.SIGTERM)
        seen |= wait_watching(learner, 30)
        stderr = output(tmp_path, "learner")[1]
        assert learner.returncode == 143, stderr
        assert stderr.splitlines() == [f"{NAME}.py: terminated (SIGTERM): {resume_line(tmp_path)}"]
        assert len(seen) == (1 if remote else 3) and not running(seen)
        if remote:
            assert remote.wait(script.HEARTBEAT_TTL + 5) == 0, output(tmp_path, "remote")
            assert "the learner ended the run; exiting" in output(tmp_path, "remote")[0]
            assert not client.exists(*(script.key(rid, name) for name in ("heartbeat", "policy", "tickets")))
            assert_every_key_expires(client, rid)
    finally:
        for p in (learner, remote):
            if p is not None and p.poll() is None:
                p.kill()


def local_samplers(learner: subprocess.Popen) -> list[int]:
    """The pids of the learner's local samplers, as they are now."""
    seen = descendants(learner.pid)
    return sorted(pid for pid, _ in seen if b"--role" in Path(f"/proc/{pid}/cmdline").read_bytes())


def test_a_local_sampler_that_dies_is_restarted_and_the_run_goes_on(tmp_path):
    """One of two local samplers killed mid-run (SIGKILL; a crash looks the same): it is started again, as a new
    sampler with its own seed stream, in one line naming it and how it ended, and the run finishes (exit 0) without
    a checkpoint ever asked for."""
    argv = [*FAST, "--num-samplers", 2, "--total-timesteps", 40 * T * K]
    learner = launch(tmp_path, "learner", *argv)
    try:
        wait_until(lambda: "iteration 1/" in output(tmp_path, "learner")[0], 90, "the first iteration")
        first, second = local_samplers(learner)
        os.kill(first, signal.SIGKILL)
        seen = wait_watching(learner, 120)
        stdout, stderr = output(tmp_path, "learner")
        assert learner.returncode == 0, stderr
        k = r"[01]"
        assert re.fullmatch(
            rf"{NAME}\.py: local sampler {k} \(pid {first}\) died \(signal SIGKILL\); restarted \(1/3 of --max-restarts\)",
            stderr.strip(),
        ), stderr
        assert len({pid for pid, _ in seen} - {first, second}) >= 2  # the server, and the sampler started again
        assert "iteration 40/40" in stdout
    finally:
        if learner.poll() is None:
            learner.kill()


def test_a_local_sampler_that_dies_past_max_restarts_ends_the_run_with_a_checkpoint(tmp_path):
    """--max-restarts 1: the learner's sampler killed, restarted; killed again: the run ends within seconds, not after
    --sampler-timeout, in one line naming the sampler and how it ended, with a checkpoint written first (the run
    never asked for one: no --checkpoint-every) and the command that resumes it; exit 1; nothing left running."""
    argv = [*FAST, "--num-samplers", 1, "--total-timesteps", 10**6, "--max-restarts", 1]
    learner = launch(tmp_path, "learner", *argv)
    try:
        wait_until(lambda: "iteration 1/" in output(tmp_path, "learner")[0], 90, "the first iteration")
        (first,) = local_samplers(learner)
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: "restarted" in output(tmp_path, "learner")[1], 30, "the restart")
        wait_until(lambda: output(tmp_path, "learner")[0].count("joined run") == 2, 60, "the new sampler to join")
        seen = descendants(learner.pid)
        (second,) = local_samplers(learner)
        os.kill(second, signal.SIGKILL)
        killed = time.monotonic()
        seen |= wait_watching(learner, 30)
        assert time.monotonic() - killed < 10
        stderr = output(tmp_path, "learner")[1]
        assert learner.returncode == 1, stderr
        restart, end = stderr.splitlines()
        assert restart.endswith("restarted (1/1 of --max-restarts)")
        assert re.fullmatch(
            rf"{NAME}\.py: error: local sampler 0 \(pid {second}\) died \(signal SIGKILL\) after --max-restarts 1 "
            rf"restarts; checkpoint written at iteration \d+; {re.escape(resume_line(tmp_path))}",
            end,
        ), end
        checkpoint = load(next(tmp_path.glob("runs/*/checkpoint.pt")))
        assert checkpoint["iteration"] >= 1
        assert not running(seen)
    finally:
        if learner.poll() is None:
            learner.kill()


def test_a_closed_stdout_stops_the_printing_not_the_run(tmp_path):
    """`... | head -1`: stdout closed after the learner's first line, while its samplers (which share it) still print.
    The run trains to its end (exit 0, checkpoint and model written), and stderr holds only the line of each process
    whose output stopped, naming stdout; no sampler died of it."""
    argv = [*FAST, "--num-samplers", 2, "--total-timesteps", 6 * T * K, "--checkpoint-every", 2, "--save-model"]
    with open(tmp_path / "learner.err", "w") as err:
        learner = subprocess.Popen(
            script_command(NAME, *argv, "--eval-episodes", 1),
            cwd=tmp_path,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
            stdout=subprocess.PIPE,
            stderr=err,
        )
    try:
        assert learner.stdout.readline().startswith(b"run folder: ")
        learner.stdout.close()  # as `head -1` does once it has its line
        wait_watching(learner, 120)
    finally:
        if learner.poll() is None:
            learner.kill()
    stderr = (tmp_path / "learner.err").read_text()
    assert learner.returncode == 0, stderr
    lines = stderr.splitlines()
    assert lines and set(lines) == {
        f"{NAME}.py: cannot write to stdout (Broken pipe): its output stops, the work goes on"
    }
    run_dir = only_run_dir(tmp_path / "runs")
    assert load(run_dir / "model.pt")["global_step"] == 6 * T * K and load(run_dir / "checkpoint.pt")["iteration"] == 6


def test_a_server_out_of_memory_ends_the_learner_in_one_line_and_its_samplers_without_a_traceback(tmp_path):
    """A server that refuses writes (its maxmemory reached, noeviction) in the middle of a run: the learner's
    one line naming it, what to do and the resume command, exit 1; its local sampler stopped quietly; a sampler
    started elsewhere ends with one line of its own, exit 1; every key of the run expires. Its own server: the
    module's stays writable for the other tests."""
    process, url = start_redis_server()
    client, rid = redis.Redis.from_url(url), run_id()
    learner = remote = None
    try:
        learner = launch(
            tmp_path,
            "learner",
            *FAST,
            "--total-timesteps",
            10**6,
            "--checkpoint-every",
            1,
            "--num-samplers",
            1,
            "--redis-url",
            url,
            "--run-id",
            rid,
        )
        remote = launch(tmp_path, "remote", "--role", "sampler", "--redis-url", url, "--run-id", rid)
        wait_until(lambda: list(tmp_path.glob("runs/*/checkpoint.pt")), 90, "the first checkpoint")
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)  # below what the server holds: every write that adds memory is refused
        seen = descendants(learner.pid) | wait_watching(learner, 30)
        stderr = output(tmp_path, "learner")[1]
        assert learner.returncode == 1, stderr
        assert stderr.splitlines() == [
            f"{NAME}.py: error: the Redis server at {url} refused a write: out of memory (its maxmemory is reached "
            "and it evicts nothing); free memory on it or raise its maxmemory (redis-cli CONFIG SET maxmemory ...), "
            f"then resume with the same --redis-url: {resume_line(tmp_path)}"
        ]
        assert len(seen) == 1 and not running(seen)  # the local sampler
        assert remote.wait(2 * script.HEARTBEAT_TTL + 5) == 1
        lines = output(tmp_path, "remote")[1].splitlines()
        assert len(lines) == 1 and re.fullmatch(
            r"sampler \d+: the Redis server refused a write: out of memory \(.*\); exiting", lines[0]
        ), lines
        assert not client.exists(script.key(rid, "heartbeat"))
        assert_every_key_expires(client, rid)
        assert load(next(tmp_path.glob("runs/*/checkpoint.pt")))["iteration"] >= 1  # the last checkpoint is whole
    finally:
        for p in (learner, remote):
            if p is not None and p.poll() is None:
                p.kill()
        stop_processes([process])


# MALFORMED AND FOREIGN CHUNKS ---------------------------------------------------------------------


def valid_chunk(steps: int = T, obs_dim: int = 2, act_dim: int = 2) -> dict[str, np.ndarray]:
    """Arrays of chunk_schema: zeros, the episode at step 4 (an end step)."""
    chunk = {
        name: np.zeros([0 if isinstance(d, range) else d for d in shape], dtype)
        for name, (dtype, shape) in script.chunk_schema(steps, obs_dim, act_dim).items()
    }
    chunk["dones"][4] = chunk["terminated"][4] = 1
    chunk["episodes"] = np.array([[4, 3.0, 5]])
    return chunk


def message(rid: str, chunk: dict | None = None, **header) -> bytes:
    return script.encode_message(
        {"run_id": rid, "version": 1, "sampler": 9, "seq": 1, **header}, valid_chunk() if chunk is None else chunk
    )


def flip_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


def changed(**arrays) -> dict:
    return {**valid_chunk(), **arrays}


def float_with_nan():
    values = np.zeros(T, np.float32)
    values[3] = np.nan
    return values


CORRUPT = {  # case -> the message made from a valid one of run "r"
    "wrong_shape": lambda: message("r", changed(obs=np.zeros((T, 3), np.float32))),
    "wrong_dtype": lambda: message("r", changed(values=np.zeros(T, np.float64))),
    "missing_array": lambda: message("r", {k: v for k, v in valid_chunk().items() if k != "returns"}),
    "foreign_run": lambda: message("other"),
    "bad_checksum": lambda: flip_last_byte(message("r")),
    "truncated": lambda: message("r")[:-8],
    "extra_bytes": lambda: message("r") + b"\0" * 8,
    "garbage": lambda: os.urandom(300),
    "header_too_long": lambda: (1 << 30).to_bytes(4, "big") + message("r")[4:],
    "not_json": lambda: (5).to_bytes(4, "big") + b"\x80abcd" + bytes(100),
    "pickle": lambda: __import__("pickle").dumps(valid_chunk()),
    "bool_version": lambda: message("r", version=True),
    "no_sampler": lambda: message("r", sampler="9"),
    "not_finite": lambda: message("r", changed(values=float_with_nan())),
    "termination_not_an_end": lambda: message("r", changed(dones=np.zeros(T, np.uint8))),
    "bootstrapped_termination": lambda: message("r", changed(final_values=np.ones(T, np.float32))),
    "episode_off_an_end": lambda: message("r", changed(episodes=np.array([[5, 3.0, 5]]))),
}


def test_chunk_round_trip():
    chunk = valid_chunk()
    chunk["obs"][:] = np.arange(2 * T).reshape(T, 2)
    header, decoded = script.decode_chunk(message("r", chunk, seq=7), "r", script.chunk_schema(T, 2, 2))
    assert (header["run_id"], header["version"], header["sampler"], header["seq"]) == ("r", 1, 9, 7)
    assert decoded.keys() == chunk.keys()
    for name, array in chunk.items():
        assert decoded[name].dtype == array.dtype and np.array_equal(decoded[name], array), name


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_chunks_are_refused(case):
    with pytest.raises(script.BadMessage):
        script.decode_chunk(CORRUPT[case](), "r", script.chunk_schema(T, 2, 2))


def test_malformed_and_foreign_chunks_are_dropped_and_counted(tmp_path, server, client):
    """Pushed into a running learner's queue: each is counted under debug/malformed_chunks (a stale one
    under debug/stale_chunks), none is trained on or stops it, and the chunk accounting holds (what was
    trained is what the samplers sent)."""
    rid, iterations = run_id(), 4
    learner = launch(
        tmp_path,
        "learner",
        *FAST,
        "--redis-url",
        server,
        "--run-id",
        rid,
        "--num-samplers",
        1,
        "--total-timesteps",
        iterations * T * K,
    )
    wait_until(lambda: client.exists(script.key(rid, "policy")), 30, "the first version")
    bad = [
        message(rid, changed(obs=np.zeros((T, 3), np.float32))),
        message("other-run"),
        flip_last_byte(message(rid)),
        os.urandom(200),
    ]
    stale = message(rid, version=0)  # well formed, of a version older than the current one
    client.rpush(script.key(rid, "chunks"), *bad, stale)
    wait_watching(learner, 90)
    assert learner.returncode == 0, output(tmp_path, "learner")[1]
    scalars = read_scalars(only_run_dir(tmp_path / "runs"))
    assert sum(v for _, v in scalars["debug/malformed_chunks"]) == len(bad)
    assert sum(v for _, v in scalars["debug/stale_chunks"]) == 1
    assert counts(client, rid, "stale") == {(0, 9): 1} and (0, 9) not in counts(client, rid, "trained")
    assert [s for s, _ in scalars["charts/SPS"]] == [k * T * K for k in range(1, iterations + 1)]
    assert_chunks_accounted(client, rid, iterations)


# BAD INPUT ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--redis-url", "redis://127.0.0.1:1/0"], ["--redis-url", "127.0.0.1:1", "cannot reach"]),
        (["--redis-url", "nonsense"], ["--redis-url", "nonsense", "not a Redis URL"]),
        (["--role", "sampler", "--redis-url", "redis://127.0.0.1:1/0"], ["--run-id"]),
    ],
)
def test_bad_redis_arguments_get_one_line_and_exit_code_2(tmp_path, argv, words):
    result = run_script(NAME, "--env-id", ENV, *argv, cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{NAME}.py: error: "), result.stderr
    for word in words:
        assert word in lines[0]
    assert not (tmp_path / "runs").exists()


def test_evaluation_records_every_episode_on_video(tmp_path):
    """`--evaluate --capture-video` in this script: its evaluate records with RecordVideo (MuJoCo off-screen),
    as ppo_continuous_action.py's does (tests/test_end_to_end.py runs that one from a saved model)."""
    args = script.Args(env_id="Hopper-v4")
    agent, normalizer = script.Agent(11, 3), script.ObsNormalizer((11,), args.obs_clip)
    checkpoint = {"args": asdict(args), "model": agent.state_dict(), "obs_rms": normalizer.rms.state_dict()}
    prefix = tmp_path / "videos" / "model-eval"
    script.evaluate(checkpoint, 1, False, 0, video_prefix=str(prefix))
    (video,) = (tmp_path / "videos").glob("model-eval-episode-*.mp4")
    assert video.name == "model-eval-episode-0.mp4" and video.stat().st_size > 1000


def test_an_environment_that_cannot_be_made_here_is_refused_in_one_line(tmp_path):
    """Pusher-v4 needs mujoco<3 (gymnasium raises ImportError): one line naming the environment, exit 2,
    for the learner's check before any work and for a sampler's environment."""
    mujoco = pytest.importorskip("mujoco")
    if int(mujoco.__version__.split(".")[0]) < 3:
        pytest.skip("Pusher-v4 can be made with this mujoco")
    result = run_script(NAME, "--env-id", "Pusher-v4", cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    # above it only gymnasium's deprecation warning for a -v4 id (Hopper-v4's too), no traceback
    lines = [line for line in result.stderr.splitlines() if "Warning" not in line and "logger.deprecation" not in line]
    assert len(lines) == 1 and lines[0].startswith(f"{NAME}.py: error: cannot make Pusher-v4 here: "), result.stderr
    assert "mujoco<3" in lines[0] and "Traceback" not in result.stderr and not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit) as exit_info:
        script.Sampler(script.Args(env_id="Pusher-v4"), 1, str(tmp_path))
    assert exit_info.value.code == 2


# THE EMBEDDED SERVER AND OPEN SERVERS (issue 26) --------------------------------------------------


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on TCP `port` of this machine (/proc/net/tcp and tcp6:
    each address in hex, 32-bit words in host byte order; state 0A is LISTEN)."""
    found = set()
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        table = Path("/proc/net") / name
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].split(":")
            if fields[3] == "0A" and int(port_hex, 16) == port:
                raw = b"".join(
                    int(address[i : i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(address), 8)
                )
                found.add(socket.inet_ntop(family, raw))
    return found


def outward_address() -> str | None:
    """This machine's own address towards other machines, if it has one: the source address the kernel
    picks for a UDP socket connected to TEST-NET-1 (connecting a UDP socket sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:  # no route: no network at all
            return None
        address = probe.getsockname()[0]
    return None if ipaddress.ip_address(address).is_loopback else address


def test_the_embedded_server_listens_on_loopback_only_and_keeps_nothing(server, client):
    """The redis-server a learner starts for itself (ppolab.redis_server.start_redis_server) listens on 127.0.0.1
    and nowhere else, so no other machine can push chunks or weights into the run, and it writes no files (no
    snapshots, no append-only log: it inherits the learner's limits, a file-size limit included)."""
    port = int(server.rsplit(":", 1)[1].split("/")[0])
    assert client.ping()
    assert listening_addresses(port) == {"127.0.0.1"}
    assert client.config_get("save") == {"save": ""} and client.config_get("appendonly") == {"appendonly": "no"}
    address = outward_address()
    if address is not None:  # the machine's own address on its network: refused, as from another machine
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((address, port), timeout=5).close()


def test_listening_addresses_sees_a_socket_on_every_address():
    """The helper above finds what it must refuse: a socket bound to all addresses."""
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        assert listening_addresses(listener.getsockname()[1]) == {"0.0.0.0"}


OPEN = "redis://lab.invalid:6379/0"  # .invalid never resolves (RFC 6761): no test reaches a machine


@pytest.mark.parametrize(
    "url, host",
    [
        (OPEN, "lab.invalid"),
        ("redis://user@lab.invalid:6379/0", "lab.invalid"),
        ("redis://:@lab.invalid/0", "lab.invalid"),
        ("rediss://10.1.2.3:6380/0", "10.1.2.3"),
        ("redis://[2001:db8::1]:6379/0", "2001:db8::1"),
        ("redis://:PASSWORD@lab.invalid:6379/0", None),
        ("redis://user:PASSWORD@lab.invalid:6379/0", None),
        ("redis://lab.invalid:6379/0?password=PASSWORD", None),
        ("redis://127.0.0.1:6379/0", None),
        ("redis://127.8.9.10:6379/0", None),
        ("redis://localhost:6379/0", None),
        ("redis://LOCALHOST.:6379/0", None),
        ("redis://[::1]:6379/0", None),
        ("unix:///run/redis/redis.sock", None),
    ],
)
def test_a_server_is_open_on_another_machine_without_a_password(url, host):
    assert open_redis_host(url) == host
    allow = ["--allow-open-redis"] if host else []  # the command printed for the samplers passes it on
    assert script.sampler_command(url, "r") == [
        "python",
        f"{NAME}.py",
        "--role",
        "sampler",
        "--redis-url",
        url,
        "--run-id",
        "r",
        *allow,
    ]


@pytest.mark.parametrize("role", ["learner", "sampler"])
def test_an_open_server_is_refused_in_one_line_before_any_connection(role, tmp_path, monkeypatch, capsys):
    def no_network(*args, **kwargs):
        raise AssertionError("a connection or name lookup was tried")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(SystemExit) as exit_info:
        script.main(
            script.Args(env_id=ENV, role=role, redis_url=OPEN, run_id="r", runs_dir=str(tmp_path / "runs"), cuda=False)
        )
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and f": error: --redis-url {OPEN}: " in lines[0], lines
    for words in ("the server on lab.invalid has no password", "push chunks and weights", "--allow-open-redis"):
        assert words in lines[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--allow-open-redis"],
        ["--role", "sampler", "--run-id", "r"],
        ["--role", "sampler", "--run-id", "r", "--allow-open-redis"],
    ],
)
def test_an_open_server_from_the_command_line(tmp_path, argv):
    """Refused without --allow-open-redis; with it, the server is tried and cannot be reached: the usual
    one line (no traceback), exit 2, for the learner and a sampler."""
    result = run_script(NAME, "--env-id", ENV, "--redis-url", OPEN, *argv, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{NAME}.py: error: --redis-url {OPEN}: "), result.stderr
    expected = "cannot reach the Redis server" if "--allow-open-redis" in argv else "--allow-open-redis"
    assert expected in lines[0]
    assert not (tmp_path / "runs").exists()


def test_a_password_or_the_flag_lets_an_open_server_through_the_check():
    check_redis_url("redis://:PASSWORD@lab.invalid:6379/0", allow_open=False)
    check_redis_url(OPEN, allow_open=True)


# A FULL DISK ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "limit, checkpoint_every, file",
    [
        (100_000, 1, "{run_dir}/checkpoint.pt"),  # below a checkpoint's size (136 KB here): its first write fails
        (1_000, 0, "the TensorBoard events in {run_dir}"),  # below the first events written
    ],
)
def test_a_refused_write_ends_the_learner_its_samplers_and_its_server_in_one_line(
    tmp_path, limit, checkpoint_every, file
):
    """Under a file-size limit (inherited by every process of the run; Python ignores SIGXFSZ, so a write
    fails with EFBIG): the learner's one line naming the file and the run's state, exit 1, no .tmp left, and
    its samplers and embedded server (which writes no files) gone without a line of their own."""

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    argv = [*FAST, "--num-samplers", 2, "--total-timesteps", 10**6, "--checkpoint-every", checkpoint_every]
    with open(tmp_path / "learner.out", "w") as out, open(tmp_path / "learner.err", "w") as err:
        learner = subprocess.Popen(
            script_command(NAME, *argv),
            cwd=tmp_path,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
            stdout=out,
            stderr=err,
            preexec_fn=limited,
        )
    seen = wait_watching(learner, 120)
    time.sleep(1)  # anything the samplers or the server would still say
    stderr = output(tmp_path, "learner")[1]
    run_dir = only_run_dir(tmp_path / "runs").relative_to(tmp_path)
    assert learner.returncode == 1, stderr
    advice = " yet" if checkpoint_every else " (--checkpoint-every N writes one every N iterations)"
    assert stderr.splitlines() == [
        f"{NAME}.py: error: cannot write {file.format(run_dir=run_dir)}: File too large; "
        f"no checkpoint in {run_dir}{advice}"
    ]
    assert not list((tmp_path / run_dir).glob("*.tmp"))
    assert seen and not running(seen), "a process of the run is left"
