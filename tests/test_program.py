"""The program a script is, from its last line to its exit (ppolab/program.py, the scripts' `ppolab.run_program`):
a signal at any moment ends it with the right exit code (130, 143, 129) and one line at most, never a traceback,
never exit 0: as run_program starts, during --evaluate, during a run (SIGHUP as SIGTERM, unless `nohup`
ignores it), in the exit's own work after the last iteration. And output that cannot be written (a closed pipe, a
full disk) stops the printing, never the run, in one line on the other stream that names the one that failed.

The stages are tested on small programs that pause where the signal must land (the command line, an atexit function), the
rest on ppo.py; the Redis script's samplers, which share the learner's stdout, in its own file."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import ppo
import ppolab
from helpers import default_ctrl_c, load, only_run_dir, script_command
from scripts import REPO, SCRIPTS, script_path

TINY = ["--num-envs", 2, "--num-steps", 32, "--num-minibatches", 2, "--update-epochs", 1]


def start(command: list, cwd, **kwargs) -> subprocess.Popen:
    """`command` with this repository's ppolab first on the path, one thread, the default Ctrl-C."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "preexec_fn": default_ctrl_c, **kwargs}
    return subprocess.Popen(list(map(str, command)), cwd=cwd, env=env, text=True, **kwargs)


def program(tmp_path: Path, text: str) -> list[str]:
    """A program `program.py` of `text` in tmp_path, as the command that runs it."""
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(text))
    return [sys.executable, path]


def signalled_when(process: subprocess.Popen, said: str, signum: int) -> tuple[int, list[str]]:
    """Sends `signum` once the process printed the line `said`; returns its exit code and its stderr's lines."""
    for line in process.stdout:
        if line.strip() == said:
            process.send_signal(signum)
            break
    _, stderr = process.communicate(timeout=120)
    return process.returncode, stderr.splitlines()


def test_every_script_ends_in_run_program_and_sorts_its_imports_as_ruff_does():
    """The script's last line runs its main as the program, which takes the signals and the output from there on;
    its imports are in the usual order (ruff's import sort, which an editor's "organize imports" also applies)."""
    for name in SCRIPTS:
        lines = script_path(name).read_text().splitlines()
        assert lines[-1].strip().startswith("ppolab.run_program(main, Args"), name
    paths = [str(script_path(name)) for name in SCRIPTS]
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "I", *paths], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


def test_importing_ppolab_in_a_fresh_interpreter_changes_nothing_in_the_process():
    """`python -c "import ppolab"` (the program's own top level, as a REPL or a notebook is): the signal handlers and
    the output streams are what they were, and ppolab sets no environment variable (the libraries it imports, loaded
    first here, may set their own)."""
    check = """
        import os, signal, sys
        import gymnasium, numpy, torch, tyro
        before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.stdout, sys.stderr)
        environ = dict(os.environ)
        import ppolab, ppolab.processes, ppolab.redis_server, ppolab.stops
        same_environ = dict(os.environ) == environ
        import ppolab.distributed
        after = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.stdout, sys.stderr)
        print(before == after, same_environ)
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(check)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.stdout.split() == ["True", "True"], result.stdout + result.stderr


def test_importing_ppolab_from_a_module_leaves_the_signals_and_the_output_alone():
    """Only the program's own script takes them over: a test, a tool or a notebook importing ppolab keeps its own."""
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert not isinstance(sys.stdout, ppolab.program.Output)


PAUSED_PARSE = """
    import time

    import ppolab


    class Args(ppolab.RunSettings):
        pass


    def slow_parse(Args, **options):  # the command line read slowly: the signal surely lands while it is read
        print("parsing", flush=True)
        time.sleep(60)


    ppolab.command_line.parse = slow_parse
    ppolab.run_program(print, Args)
"""


@pytest.mark.parametrize("signum, code, lines", [(signal.SIGINT, 130, 1), (signal.SIGTERM, 143, 0)])
def test_a_signal_as_the_program_starts_ends_it_in_one_line_at_most(signum, code, lines, tmp_path):
    """Ctrl-C while run_program reads the command line: exit 130 and one line, not a KeyboardInterrupt traceback;
    SIGTERM: exit 143, quietly."""
    returncode, stderr = signalled_when(start(program(tmp_path, PAUSED_PARSE), tmp_path), "parsing", signum)
    assert returncode == code
    assert stderr == ["program.py: interrupted"][:lines]


EXIT_WORK = """
    import atexit
    import time

    import ppolab


    class Args(ppolab.RunSettings):
        pass


    def main(args):
        atexit.register(time.sleep, 60)  # the exit's own work, as a library's atexit function
        atexit.register(print, "exiting", flush=True)
        print("main done", flush=True)


    ppolab.run_program(main, Args)
"""


@pytest.mark.parametrize("signum, code, lines", [(signal.SIGTERM, 143, 0), (signal.SIGINT, 130, 1)])
def test_a_signal_while_the_program_exits_after_its_work_gives_its_exit_code(signum, code, lines, tmp_path):
    """SIGTERM once main returned, while an atexit function runs: exit 143 without a traceback (not exit 0 with a
    traceback of the atexit function, not a silent death); Ctrl-C: 130 and one line."""
    returncode, stderr = signalled_when(start(program(tmp_path, EXIT_WORK), tmp_path), "exiting", signum)
    assert returncode == code
    assert stderr == ["program.py: interrupted while exiting; its work was done"][:lines]


def test_the_program_exits_with_mains_exit_code_and_its_message(tmp_path):
    """What main ends with is the program's exit: 0, a SystemExit's code, or its message and 1; a bug's traceback
    stays a traceback."""
    for body, code, said in (
        ("pass", 0, ""),
        ("raise SystemExit(3)", 3, ""),
        ("raise SystemExit('program.py: error: a message')", 1, "program.py: error: a message"),
        ("raise ValueError('a bug')", 1, "ValueError: a bug"),
    ):
        text = f"import ppolab\nclass Args(ppolab.RunSettings):\n    pass\ndef main(args):\n    {body}\n"
        result = subprocess.run(program(tmp_path, text + "ppolab.run_program(main, Args)\n"), capture_output=True,
                                text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)  # fmt: skip
        assert result.returncode == code and (result.stderr.strip().splitlines() or [""])[-1] == said, result.stderr


def test_ctrl_c_during_evaluate_is_one_line(tmp_path):
    """--evaluate plays its episodes (here: recording their videos, the first one written) when Ctrl-C comes: exit
    130 and one line, no traceback from the middle of an episode."""
    run_dir = ppo.main(ppo.Args(runs_dir=str(tmp_path), total_timesteps=64, save_model=True, eval_episodes=1,
                                num_envs=2, num_steps=32, cuda=False))  # fmt: skip
    process = start(
        script_command("ppo", "--evaluate", f"{run_dir}/model.pt", "--eval-episodes", 1000, "--capture-video"),
        tmp_path,
    )
    deadline = time.monotonic() + 120
    while not list(Path(run_dir, "videos").glob("*.mp4")) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert stderr.splitlines() == ["ppo.py: interrupted"]


def test_sighup_ends_a_run_as_sigterm_does_unless_nohup_ignores_it(tmp_path):
    """The terminal closed (SIGHUP): the run's line with its last checkpoint and the command that resumes it, exit
    129. Under `nohup` (SIGHUP ignored from the start) the run goes on; SIGTERM then ends it, 143."""
    argv = [*TINY, "--total-timesteps", 10**7, "--checkpoint-every", 1]
    for folder in ("hup", "nohup"):
        (tmp_path / folder).mkdir()

    def nohup():
        default_ctrl_c()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    hup = start(script_command("ppo", *argv), tmp_path / "hup")
    ignoring = start(script_command("ppo", *argv), tmp_path / "nohup", preexec_fn=nohup)
    try:
        deadline = time.monotonic() + 120
        while not all(list((tmp_path / f).glob("runs/*/checkpoint.pt")) for f in ("hup", "nohup")):
            assert time.monotonic() < deadline and hup.poll() is None and ignoring.poll() is None
            time.sleep(0.1)
        hup.send_signal(signal.SIGHUP)
        ignoring.send_signal(signal.SIGHUP)
        _, stderr = hup.communicate(timeout=60)
        assert hup.returncode == 129
        (path,) = [p.relative_to(tmp_path / "hup") for p in (tmp_path / "hup").glob("runs/*/checkpoint.pt")]
        assert stderr.splitlines() == [
            f"ppo.py: hung up (SIGHUP): last checkpoint {path}; continue with: python {script_command('ppo')[1]} "
            f"--resume {path}"
        ]
        time.sleep(2)
        assert ignoring.poll() is None  # nohup's run goes on
        ignoring.send_signal(signal.SIGTERM)
        ignoring.communicate(timeout=60)
        assert ignoring.returncode == 143
    finally:
        for process in (hup, ignoring):
            if process.poll() is None:
                process.kill()


# OUTPUT IS NOT THE RUN ---------------------------------------------------------------------------

STDOUT_LOST = "ppo.py: cannot write to stdout ({}): its output stops, the work goes on"


def assert_trained_to_its_end(cwd: Path, iterations: int):
    run_dir = only_run_dir(cwd / "runs")
    assert load(run_dir / "checkpoint.pt")["iteration"] == iterations
    assert load(run_dir / "model.pt")["global_step"] == iterations * 64
    assert any(p.name.startswith("events.out.tfevents") for p in run_dir.iterdir())


def test_a_closed_stdout_stops_the_printing_not_the_run(tmp_path):
    """`python ppo.py ... | head -1`: the pipe closed after the first line, the run trains to its end and writes
    its checkpoint, model and events, exit 0; one line on stderr names stdout."""
    argv = [*TINY, "--total-timesteps", 8 * 64, "--checkpoint-every", 4, "--save-model", "--eval-episodes", 1]
    process = start(script_command("ppo", *argv), tmp_path)
    assert process.stdout.readline().startswith("run folder: ")
    process.stdout.close()  # as `head -1` does once it has its line
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 0, stderr
    assert stderr.splitlines() == [STDOUT_LOST.format("Broken pipe")]
    assert_trained_to_its_end(tmp_path, 8)


def test_stdout_on_a_full_disk_stops_the_printing_not_the_run_and_a_full_stderr_is_named(tmp_path):
    """stdout on /dev/full: the run goes on to its end, and the line names stdout, not the TensorBoard events.
    stderr on /dev/full and bad input: the refusal cannot be written, and stdout says that stderr failed."""
    argv = [*TINY, "--total-timesteps", 4 * 64, "--checkpoint-every", 4, "--save-model", "--eval-episodes", 1]
    with open("/dev/full", "w") as full:
        process = start(script_command("ppo", *argv), tmp_path, stdout=full)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
        assert stderr.splitlines() == [STDOUT_LOST.format("No space left on device")]
        assert_trained_to_its_end(tmp_path, 4)
        process = start(script_command("ppo", "--num-steps", 0), tmp_path, stderr=full)
        stdout, _ = process.communicate(timeout=120)
    assert process.returncode == 2
    assert stdout.splitlines() == [
        "ppo.py: cannot write to stderr (No space left on device): its output stops, the work goes on"
    ]


def test_the_output_guard_drops_what_cannot_be_written_and_names_the_stream(tmp_path):
    """ppolab.program.Output on a pipe whose reader is gone: no exception, the stream lost for good, its file
    descriptor sent to /dev/null (what its buffer still holds flushes there without an error), the other stream's
    one line."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = os.fdopen(write_end, "w")
    other = ppolab.program.Output(open(tmp_path / "other", "w"), "stderr")
    guarded = ppolab.program.Output(stream, "stdout")
    real_stderr, sys.stderr = sys.stderr, other
    try:
        guarded.write("a line\n")
        guarded.flush()  # the pipe's EPIPE
        guarded.write("more\n")
        guarded.flush()
    finally:
        sys.stderr = real_stderr
    assert guarded.lost and not other.lost
    assert os.readlink(f"/proc/self/fd/{write_end}") == "/dev/null"
    stream.close()
    other.stream.close()
    name = Path(sys.argv[0]).name
    assert (tmp_path / "other").read_text() == (
        f"{name}: cannot write to stdout (Broken pipe): its output stops, the work goes on\n"
    )
