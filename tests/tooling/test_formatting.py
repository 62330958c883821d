"""One formatter for the whole repository: `ruff format` (line length 120, pyproject.toml) leaves every file as it
is, so the copies of a shared piece can be compared as text and no layout differs for identical code."""

import subprocess
import sys

from scripts import REPO


def test_ruff_format_leaves_every_file_as_it_is():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_sees_a_file_out_of_format(tmp_path):
    """The check itself: a file laid out otherwise than ruff lays it out fails it."""
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 120\n")
    (tmp_path / "example.py").write_text("x = [1,2 ,3]\n")
    result = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "."], cwd=tmp_path, capture_output=True)
    assert result.returncode == 1
