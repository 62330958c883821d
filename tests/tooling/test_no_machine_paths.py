"""No committed file names a folder of the machine it was written on: a home (root's, /home/USER, /Users/USER), a
work tree, a mount, a scratch folder, and in documents (results, docs, the README: every text file that is not code)
a temporary folder. Such a path means nothing on a reader's machine; a results file names its files by paths inside
the repository (`runs/...`, `benchmark/results/...`) or by a placeholder (`DIR`).

Only an absolute path is one: its first slash starts the text or follows a space, a quote, a bracket, `=`, `:` or
another slash (`sqlite:////...`, `file:///...`), never a word (`https://host/root/...`, `tests/data/...`), a dot
(`./tmp/`) or `~` (`~/.cache/...`, the reader's own home). System paths (`/usr/bin/env`, `/dev/null`,
`/proc/cpuinfo`) are the same on every machine and are not flagged. In code (Python and shell files) a temporary
path is a value (a test's argument, an example's output) and is left alone.

The text files are those of `git ls-files`; a file with a NUL byte or that is not UTF-8 (a picture, a gzip curve, a
checkpoint) is skipped, and so is this file, which names the patterns.
"""

import re
import subprocess
from pathlib import Path

import pytest

from scripts import REPO

BEFORE = r"(?<![\w.~$}-])"  # the path's first slash follows no word, dot, ~, variable or hyphen
MACHINE = re.compile(BEFORE + r"/(?:root|work|mnt|scratch|home/[^/\s`'\"]+|Users/[^/\s`'\"]+)/")
TEMPORARY = re.compile(BEFORE + r"/(?:tmp|var/tmp|var/folders|private/var)/")
CODE_SUFFIXES = {".py", ".sh"}


def is_code(name: str, text: str) -> bool:
    return Path(name).suffix in CODE_SUFFIXES or text.startswith("#!")


def machine_paths(name: str, text: str) -> list[str]:
    """`name:line: text` for each line of `text` that holds an absolute path of a machine."""
    patterns = [MACHINE] if is_code(name, text) else [MACHINE, TEMPORARY]
    return [
        f"{name}:{number}: {line.strip()[:160]}"
        for number, line in enumerate(text.splitlines(), 1)
        if any(pattern.search(line) for pattern in patterns)
    ]


def tracked_texts():
    """(name, text) of every tracked text file, this one left out."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    own = Path(__file__).resolve().relative_to(REPO).as_posix()
    for name in names.decode().split("\0"):
        path = REPO / name
        if not name or name == own or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            yield name, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


def test_no_committed_file_holds_an_absolute_path_of_a_machine():
    found = [line for name, text in tracked_texts() for line in machine_paths(name, text)]
    assert found == [], f"{len(found)} lines name a machine's folder:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "Study `s` (sqlite:////work/main/runs/tune/s/optuna.db)",
        "runs in `/work/main/runs/tune/verdict`.",
        "virtualenv /root/.cache/ppo-lab/cleanrl-1.2.0",
        "--out=/home/alice/speed.md",
        '"/Users/bob/ppo-lab/runs"',
        "bash setup.sh --offline /tmp/i41/wh2 --torch-index file:///tmp/i41/torchindex",
        "(/mnt/nfs/wheels)",
    ],
)
def test_the_check_sees_a_machines_folder(line):
    assert machine_paths("benchmark/results/x.md", line) == [f"benchmark/results/x.md:1: {line}"]


@pytest.mark.parametrize(
    "line",
    [
        "#!/usr/bin/env bash",
        "PIP_CONFIG_FILE=/dev/null and /proc/cpuinfo",
        "https://github.com/root/work/tmp/ and https://download.pytorch.org/whl/cu128",
        "tests/data/work/x, runs/tmp/x, ./tmp/x, ../work/x",
        "~/.cache/ppo-lab/cleanrl-1.2.0 and $HOME/work/x and ${TMPDIR}/tmp/x",
        "sqlite:///runs/tune/cheetah/optuna.db",
        "/usr/bin/time -v",
    ],
)
def test_the_check_leaves_system_paths_urls_and_relative_paths_alone(line):
    assert machine_paths("docs/x.md", line) == []


def test_a_temporary_path_is_flagged_in_documents_not_in_code():
    line = "python -m benchmark.gpu --out /tmp/gpu.md"
    assert machine_paths("benchmark/gpu.py", line) == []
    assert machine_paths("docs/gpu.md", line) == [f"docs/gpu.md:1: {line}"]
    assert machine_paths("benchmark/x.py", "ROOT = '/work/main'\n") == ["benchmark/x.py:1: ROOT = '/work/main'"]
