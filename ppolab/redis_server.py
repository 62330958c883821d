"""The Redis plumbing of ppo_continuous_action_redis.py that is not its lesson (the exchange of chunks and
policies through the server is, and stays in the script): a server's URL read as written and checked before any
connection (`open_redis_host`, `redact`, `check_redis_url`), a client checked with a PING (`connect`), a
redis-server of the run's own (`start_redis_server`), the local processes a run started watched while it goes on
(`watching`) and stopped however it ends (`stop_processes`), and the one line of a run that cannot go on (`abort`).
Imported by that script alone: the other scripts do not need the redis client."""

import ctypes
import ipaddress
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import redis

from ppolab.checks import fail, program


def redact(url: str) -> str:
    """The URL with its password hidden, for everything printed, logged, saved or published."""
    parts = urlsplit(url)
    return url if parts.password is None else url.replace(f":{parts.password}@", ":***@", 1)


def open_redis_host(url: str) -> str | None:
    """The host of `url` if it is a server on another machine that anyone who reaches it may write to (no
    password); None for this machine (a loopback address, localhost, a unix socket) or a password. The name
    is read as written: nothing is looked up, nothing is contacted. A string that is not a Redis URL raises
    ValueError."""
    options = redis.connection.parse_url(url)
    host = options.get("host")  # none for a unix socket
    if host is None or options.get("password") or host.rstrip(".").lower() == "localhost":
        return None
    try:
        return None if ipaddress.ip_address(host).is_loopback else host
    except ValueError:  # a name
        return host


def check_redis_url(url: str | None, allow_open: bool):
    """--redis-url must be a Redis URL, and one of a server that only the run's own machines can write to:
    on this machine or with a password, unless --allow-open-redis (`allow_open`) says an open one is meant
    (whoever reaches it can push chunks and weights into the run). Checked before any connection is tried."""
    if url is None:
        return
    try:
        host = open_redis_host(url)
    except ValueError as e:
        fail(f"--redis-url {redact(url)} is not a Redis URL ({e}); e.g. redis://:PASSWORD@HOST:6379/0")
    if host is not None and not allow_open:
        fail(
            f"--redis-url {redact(url)}: the server on {host} has no password, so anyone who can reach "
            "it could push chunks and weights into this run; give it one (redis-server --requirepass PASSWORD, "
            "then redis://:PASSWORD@HOST:PORT/DB), or pass --allow-open-redis to use it as it is"
        )


def connect(url: str) -> redis.Redis:
    """A client of the server at `url`, checked with a PING: an unreachable server is bad input (exit 2)."""
    # the socket timeout outlasts the script's blocking pops (POP_TIMEOUT); a server that stops answering ends the run
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=30)
    try:
        client.ping()
    except redis.RedisError as e:
        fail(f"--redis-url {redact(url)}: cannot reach the Redis server ({type(e).__name__}: {e})")
    return client


def die_with_parent():
    """Run in a local child before it starts (Linux): SIGTERM when the learner dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def ignore_requests():
    """Run in a local sampler before it starts: the requeue signals (SIGUSR1, SIGUSR2), which a scheduler may send to
    every process of the job, are ignored; the learner answers them for the run."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class NoChunks(RuntimeError):
    """No chunk came for --sampler-timeout seconds (the message says so): the script's redis_lab ends the run in one
    line with where it can be resumed from."""


class ServerDidNotStart(RuntimeError):
    """The redis-server started for the run did not answer (the message says why, in one line)."""


def start_redis_server() -> tuple[subprocess.Popen, str]:
    """A `redis-server` on a free port of 127.0.0.1 without persistence, for this run alone; returns the
    process and its URL. It dies with the learner even when the learner is killed (die_with_parent). No
    redis-server installed is bad input (one line, exit 2); one that does not answer within seconds is stopped
    and raises ServerDidNotStart."""
    executable = shutil.which("redis-server")
    if executable is None:
        fail("redis-server not found (Debian package redis-server); install it or pass --redis-url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            executable,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--loglevel",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    url, deadline = f"redis://127.0.0.1:{port}/0", time.monotonic() + 10
    while time.monotonic() < deadline and server.poll() is None:
        try:
            redis.Redis.from_url(url, socket_connect_timeout=1).ping()
            return server, url
        except redis.ConnectionError:
            time.sleep(0.05)
    stop_processes([server])
    raise ServerDidNotStart(f"the embedded redis-server on port {port} did not start (exit code {server.returncode})")


def stop_processes(processes: list[subprocess.Popen]):
    """SIGTERM to every process, SIGKILL to those still there after five seconds, and wait: none is left."""
    processes = [process for process in processes if process is not None]
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + 5
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def watching(processes: list[subprocess.Popen], beat, client: redis.Redis, run, restart, max_restarts: int):
    """The learner's heartbeat `beat`, which its waits and its update call often, watching besides the local
    `processes` (the samplers it started), as a supervisor does: one that ends while the run goes on is started
    again (`restart(k)` replaces `processes[k]`; it joins as a new sampler, with its own seed stream), in one line
    each time, and the run goes on; once `max_restarts` restarts were made (--max-restarts), the next that ends ends
    the run in one line naming it and how it ended, with a checkpoint first where one can be written and where `run`
    (ppolab's Run) can be resumed from (`run.end_safely`); not a minute later as a sampler that sends nothing. A
    sampler that ended because the server is gone leaves that to the server's own error (a ping first). Looks at most
    every quarter second, from the main thread (a thread that beats for it, see the script's `beating`, only
    beats)."""
    last, restarts = [0.0], [0]

    def beat_and_watch():
        beat()
        if threading.current_thread() is not threading.main_thread() or time.monotonic() - last[0] < 0.25:
            return
        last[0] = time.monotonic()
        for k, process in enumerate(processes):
            code = None if process is None else process.poll()
            if code is not None:
                client.ping()  # the server gone: its own error (ConnectionError), which the learner reports
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                died = f"local sampler {k} (pid {process.pid}) died ({how})"
                if restarts[0] < max_restarts:
                    restarts[0] += 1
                    restart(k)
                    print(
                        f"{program()}: {died}; restarted ({restarts[0]}/{max_restarts} of --max-restarts)",
                        file=sys.stderr,
                    )
                    continue
                processes[k] = None  # (watched no more while the run ends)
                run.end_safely(f"{program()}: error: {died} after --max-restarts {max_restarts} restarts")

    return beat_and_watch


def abort(message: str):
    """A run that cannot go on (no sampler, the server gone or full): one line naming the problem, exit code 1.
    Raised inside the script's redis_lab, whose `finally` still stops the local samplers and server."""
    print(f"{program()}: error: {message}", file=sys.stderr)
    raise SystemExit(1)
