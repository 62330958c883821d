"""The README's Quickstart as a new user types it: its command blocks run in a fresh shell (no environment activated,
the system's PATH) from the repository's folder, in order, after setup, with short step budgets appended to the
training commands, the `runs/<run>` placeholder filled with the run the block made, and `tensorboard` started and
stopped after a few seconds. Every command must succeed."""

import os
import re
import subprocess

import pytest

from helpers import REPO

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHORT = "--total-timesteps 1024"


def quickstart_blocks() -> list[list[str]]:
    """The commands of each bash block under the README's Quickstart heading, comments left out."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    return [[line.split("  #")[0].strip() for line in block.splitlines() if line.strip()] for block in blocks]


def as_tested(command: str) -> str:
    """The command with a short step budget where it trains, the newest run folder for `runs/<run>`, and a server
    (tensorboard) stopped after a few seconds: exit 124 from `timeout` means it was still serving."""
    if command.startswith("tensorboard "):
        return f"timeout 8 {command} || test $? = 124"
    command = command.replace("runs/<run>", '"$(ls -td runs/*/ | head -1)"')
    if re.match(r"python \S+\.py", command) and "--evaluate" not in command:
        command += f" {SHORT}"
    return command


def test_the_quickstart_has_the_activation_and_the_headline_commands():
    commands = [command for block in quickstart_blocks() for command in block]
    assert commands[0] == "source .venv/bin/activate"
    assert "python ppo.py" in commands and "python ppo_atari.py --env-id Breakout" in commands
    assert as_tested("python ppo.py --save-model") == f"python ppo.py --save-model {SHORT}"


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "activate").exists(), reason="needs the .venv that setup.sh makes")
def test_the_quickstart_blocks_run_as_typed_in_a_fresh_shell(tmp_path):
    """A copy of the repository's scripts would do as well; the commands run in the repository itself, their runs in
    a fresh runs/ folder that the test removes (the scripts' default --runs-dir is runs/ of the current folder)."""
    script = "set -e\n" + "\n".join(as_tested(command) for block in quickstart_blocks() for command in block)
    work = tmp_path / "checkout"
    work.mkdir()
    for name in os.listdir(REPO):  # the repository as the user has it, its runs/ a new one
        if name not in ("runs", ".git"):
            (work / name).symlink_to(REPO / name)
    env = {"PATH": SYSTEM_PATH, "HOME": str(tmp_path), "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8"}
    result = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = sorted(path.name.split("__")[1] for path in (work / "runs").iterdir())
    assert runs == ["ppo", "ppo", "ppo_atari"], runs
    assert re.search(r"^evaluation of .*: 10 episodes", result.stdout, re.MULTILINE), result.stdout[-2000:]
