"""setup.sh, the README's first command, on a PATH of fake system tools that record their calls: it installs
only the missing Debian packages, through sudo only when not root, then requirements.txt with pip. CI runs it
for real as root (.ci/run); here nothing is installed."""

import os
import shutil
import subprocess

import pytest

from scripts import REPO

RECORDER = '#!/bin/sh\necho "$(basename "$0") $*" >> "$CALLS"\n'
FAKES = {
    "apt-get": RECORDER,
    "python3": RECORDER,
    "sudo": RECORDER + 'exec "$@"\n',  # records itself, then runs the command, as sudo does
    "id": '#!/bin/sh\necho "$FAKE_UID"\n',
    "ldconfig": '#!/bin/sh\necho "$FAKE_LIBS"\n',  # `ldconfig -p`: the shared libraries known to the loader
}


def run_setup(tmp_path, uid: int, qt: bool, redis: bool, sudo: bool = True):
    """setup.sh as user `uid`, with the Qt runtime and redis-server installed or not; returns the result and
    the recorded calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "grep", "dirname", "basename", "env", "cat"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    fakes = dict(FAKES, **({"redis-server": "#!/bin/sh\n"} if redis else {}))
    if not sudo:
        del fakes["sudo"]
    for name, text in fakes.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = dict(PATH=str(bin_dir), CALLS=str(calls), FAKE_UID=str(uid),
               FAKE_LIBS="\tlibQt5Gui.so.5 (libc6,x86-64) => /usr/lib/libQt5Gui.so.5" if qt else "\tlibc.so.6")
    result = subprocess.run([str(bin_dir / "bash"), str(REPO / "setup.sh")], env=env, capture_output=True,
                            text=True, timeout=30)
    return result, calls.read_text().splitlines() if calls.exists() else []


PIP = "python3 -m pip install --quiet --disable-pip-version-check -r requirements.txt"


@pytest.mark.parametrize("uid", [0, 1000])
def test_nothing_missing_installs_only_the_python_packages(tmp_path, uid):
    result, calls = run_setup(tmp_path, uid=uid, qt=True, redis=True)
    assert result.returncode == 0, result.stderr
    assert calls == [PIP]


def test_as_root_apt_get_runs_without_sudo(tmp_path):
    result, calls = run_setup(tmp_path, uid=0, qt=False, redis=False, sudo=False)
    assert result.returncode == 0, result.stderr
    assert calls == ["apt-get update -qq",
                     "apt-get install -y -qq --no-install-recommends libqt5gui5 redis-server", PIP]


def test_as_a_user_apt_get_runs_through_sudo_for_the_missing_package_only(tmp_path):
    result, calls = run_setup(tmp_path, uid=1000, qt=False, redis=True)
    assert result.returncode == 0, result.stderr
    assert calls == ["sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq", "apt-get update -qq",
                     "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libqt5gui5",
                     "apt-get install -y -qq --no-install-recommends libqt5gui5", PIP]


def test_as_a_user_without_sudo_it_says_what_is_missing(tmp_path):
    result, calls = run_setup(tmp_path, uid=1000, qt=True, redis=False, sudo=False)
    assert result.returncode == 1
    assert result.stderr.strip() == "setup.sh: error: redis-server missing, and neither root nor sudo to install them"
    assert calls == []
