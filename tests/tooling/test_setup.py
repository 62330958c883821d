"""setup.sh, the README's first command, on a PATH of fake system tools and fake Pythons that record their calls:
which environment it installs into (an activated virtualenv or conda env, else a project .venv made with the first
Python 3.11+), the missing Debian packages only (python3.X-venv among them when venv lacks ensurepip), through sudo
only when not root, and a one-line error for everything it can't get. Each run copies setup.sh into a temporary
folder, so nothing is made in this checkout and nothing is installed. CI runs it for real with the system's python3
(.ci/run). Then, for real: pyproject.toml's dependencies are requirements.txt's (pip's own reading of it), `uv run`
trains CartPole-v1 with them, and .ci/run runs the README's commands."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from scripts import REPO

RECORDER = '#!/bin/sh\necho "$(basename "$0") $*" >> "$CALLS"\n'
FAKES = {
    "apt-get": RECORDER,
    "sudo": RECORDER + 'exec "$@"\n',  # records itself, then runs the command, as sudo does
    "id": '#!/bin/sh\necho "$FAKE_UID"\n',
    "ldconfig": '#!/bin/sh\necho "$FAKE_LIBS"\n',  # `ldconfig -p`: the shared libraries known to the loader
}
TOOLS = ("bash", "grep", "dirname", "basename", "env", "cat", "ln", "rm", "mkdir", "cp", "sed")
DEBIAN_VENV_ERROR = """The virtual environment was not created successfully because ensurepip is not
available.  On Debian/Ubuntu systems, you need to install the python3-venv
package using the following command.

    apt install python3.11-venv
"""


def fake_python(path, version="3.11", ensurepip=True, pip=True, venv_error="", in_venv=False):
    """A Python that records its calls ($0 as called, the probe's code left out): `-c` prints what setup.sh's probe
    prints ("3.11 1 1": version, has ensurepip, has pip); `-m venv DIR` makes DIR/bin/python, a Python of the same
    version with pip (or prints venv_error, leaves DIR half made and fails)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    make_venv = (
        f"printf '%s\\n' '{venv_error}' >&2; mkdir -p \"$3\"; exit 1"
        if venv_error
        else f'mkdir -p "$3/bin" && cp "{path}.in-venv" "$3/bin/python"'
    )
    path.write_text(f"""#!/bin/sh
if [ "$1" = -c ]; then echo "$0 -c" >> "$CALLS"; else echo "$0 $*" >> "$CALLS"; fi
case "$1 $2" in
    "-c "*) echo "{version} {int(ensurepip)} {int(pip)}" ;;
    "-m venv") {make_venv} ;;
esac
""")
    path.chmod(0o755)
    if not in_venv:  # what venv copies
        fake_python(path.with_name(path.name + ".in-venv"), version, in_venv=True)
    return path


def run_setup(
    tmp_path, uid=0, qt=True, redis=True, sudo=True, apt=True, pythons=None, env=None, args=(), files=None, timeout=30
):
    """setup.sh `args`, copied into tmp_path/repo with requirements.txt and pyproject.toml (or `files`, {path: text}),
    as user `uid`, with the Qt runtime and redis-server installed or not and the fake Pythons `pythons` ({name:
    fake_python kwargs, or a real Python's path}, default a Debian 12 python3) on PATH; returns the result and the
    recorded calls, paths relative to tmp_path."""
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    for name in ("setup.sh", "requirements.txt", "pyproject.toml"):
        shutil.copy(REPO / name, repo)
    for name, text in (files or {}).items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        os.symlink(shutil.which(tool), bin_dir / tool)
    fakes = dict(FAKES, **({"redis-server": "#!/bin/sh\n"} if redis else {}))
    if not sudo:
        del fakes["sudo"]
    if not apt:
        del fakes["apt-get"]
    for name, text in fakes.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for name, kwargs in (pythons if pythons is not None else {"python3": {}}).items():
        if isinstance(kwargs, Path):
            os.symlink(kwargs, bin_dir / name)
        else:
            fake_python(bin_dir / name, **kwargs)
    calls = tmp_path / "calls"
    full_env = dict(
        PATH=str(bin_dir),
        CALLS=str(calls),
        FAKE_UID=str(uid),
        FAKE_LIBS="\tlibQt5Gui.so.5 (libc6,x86-64) => /usr/lib/libQt5Gui.so.5" if qt else "\tlibc.so.6",
        **(env or {}),
    )
    result = subprocess.run(
        [str(bin_dir / "bash"), "repo/setup.sh", *args],
        cwd=tmp_path,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = calls.read_text().splitlines() if calls.exists() else []
    return result, [line.replace(f"{tmp_path}/", "") for line in lines]


PIP_ARGS = "-m pip install --quiet --disable-pip-version-check -r requirements.txt -e ."
PIP = f"repo/.venv/bin/python {PIP_ARGS}"  # .venv's python by its path, without links
ENV_PIP = f"env/bin/python {PIP_ARGS}"  # an activated environment's python by its own path, not through .venv
PROBE = "bin/python3 -c"
VENV = "bin/python3 -m venv .venv"
APT_UPDATE = "apt-get update -qq"
APT_INSTALL = "apt-get install -y -qq --no-install-recommends"


def error_line(result):
    """The one line setup.sh printed on stderr, which must be all it printed there."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("setup.sh: error: "), result.stderr
    return lines[0]


# Without an active environment: the project virtualenv .venv ---------------------------------------------------


@pytest.mark.parametrize("uid", [0, 1000])
def test_nothing_missing_makes_dot_venv_and_installs_the_python_packages_into_it(tmp_path, uid):
    result, calls = run_setup(tmp_path, uid=uid)
    assert result.returncode == 0, result.stderr
    assert calls == [PROBE, VENV, PIP]
    venv = tmp_path / "repo" / ".venv"
    assert (venv / "bin" / "python").is_file() and not venv.is_symlink()
    assert "run a script with .venv/bin/python" in result.stdout


def test_as_root_apt_get_runs_without_sudo(tmp_path):
    result, calls = run_setup(tmp_path, uid=0, qt=False, redis=False, sudo=False)
    assert result.returncode == 0, result.stderr
    assert calls == [PROBE, APT_UPDATE, f"{APT_INSTALL} libqt5gui5 redis-server", VENV, PIP]


def test_as_a_user_apt_get_runs_through_sudo_for_the_missing_package_only(tmp_path):
    result, calls = run_setup(tmp_path, uid=1000, qt=False, redis=True)
    assert result.returncode == 0, result.stderr
    assert calls == [
        PROBE,
        f"sudo env DEBIAN_FRONTEND=noninteractive {APT_UPDATE}",
        APT_UPDATE,
        f"sudo env DEBIAN_FRONTEND=noninteractive {APT_INSTALL} libqt5gui5",
        f"{APT_INSTALL} libqt5gui5",
        VENV,
        PIP,
    ]


def test_stock_debian_without_python3_venv_gets_it_from_apt_before_making_the_venv(tmp_path):
    """Debian/Ubuntu's python3 without python3.X-venv has no ensurepip, and `python3 -m venv` fails."""
    result, calls = run_setup(tmp_path, uid=1000, qt=False, pythons={"python3": dict(ensurepip=False)})
    assert result.returncode == 0, result.stderr
    assert calls == [
        PROBE,
        f"sudo env DEBIAN_FRONTEND=noninteractive {APT_UPDATE}",
        APT_UPDATE,
        f"sudo env DEBIAN_FRONTEND=noninteractive {APT_INSTALL} python3.11-venv libqt5gui5",
        f"{APT_INSTALL} python3.11-venv libqt5gui5",
        VENV,
        PIP,
    ]


def test_ubuntu_24_04_python3_12_gets_its_own_venv_package(tmp_path):
    result, calls = run_setup(tmp_path, pythons={"python3": dict(version="3.12", ensurepip=False)})
    assert result.returncode == 0, result.stderr
    assert calls == [PROBE, APT_UPDATE, f"{APT_INSTALL} python3.12-venv", VENV, PIP]


def test_an_older_python3_is_passed_over_for_a_python3_11_beside_it(tmp_path):
    """Ubuntu 22.04: python3 is 3.10, python3.11 is a package of its own."""
    result, calls = run_setup(tmp_path, pythons={"python3": dict(version="3.10"), "python3.11": {}})
    assert result.returncode == 0, result.stderr
    assert calls == [PROBE, "bin/python3.11 -c", "bin/python3.11 -m venv .venv", PIP]


@pytest.mark.parametrize(
    "pythons, found",
    [
        ({"python3": dict(version="3.9")}, "python3 is 3.9"),
        ({"python3": dict(version="3.10"), "python3.12": dict(version="2.7")}, "python3 is 3.10 python3.12 is 2.7"),
        ({}, "no python3 on PATH"),
    ],
)
def test_without_python_3_11_it_says_what_to_install(tmp_path, pythons, found):
    result, calls = run_setup(tmp_path, qt=False, pythons=pythons)
    assert error_line(result) == (
        f"setup.sh: error: ppo-lab needs Python 3.11 or later ({found}): install one (Debian 12, Ubuntu 24.04: "
        "apt-get install python3 python3-venv; Ubuntu 22.04: apt-get install python3.11 python3.11-venv) or "
        "activate a virtualenv or conda env that has one"
    )
    assert not any(call.startswith(("apt-get", "sudo")) for call in calls)  # nothing installed for a failed setup
    assert not (tmp_path / "repo" / ".venv").exists()


def test_as_a_user_without_sudo_it_says_what_is_missing(tmp_path):
    result, calls = run_setup(
        tmp_path, uid=1000, qt=True, redis=False, sudo=False, pythons={"python3": dict(ensurepip=False)}
    )
    assert error_line(result) == (
        "setup.sh: error: python3.11-venv redis-server missing, and neither root nor sudo "
        "to install them: ask an administrator to run apt-get install python3.11-venv "
        "redis-server"
    )
    assert calls == [PROBE]


def test_without_apt_get_it_says_what_is_missing(tmp_path):
    result, calls = run_setup(tmp_path, qt=False, apt=False)
    assert error_line(result) == (
        "setup.sh: error: libqt5gui5 missing, and no apt-get to install them (not "
        "Debian/Ubuntu?): install their equivalents with your system's package manager"
    )
    assert calls == [PROBE]


def test_a_failed_venv_is_one_line_and_leaves_no_dot_venv(tmp_path):
    result, calls = run_setup(tmp_path, pythons={"python3": dict(venv_error=DEBIAN_VENV_ERROR)})
    line = error_line(result)
    assert line.startswith(
        f"setup.sh: error: {tmp_path}/bin/python3 -m venv .venv failed (The virtual environment "
        "was not created successfully because ensurepip is not available. On Debian/Ubuntu"
    )
    assert line.endswith(
        "apt install python3.11-venv): install python3.11-venv, or activate a virtualenv or conda "
        "env and run setup.sh again"
    )
    assert calls == [PROBE, VENV]
    assert not (tmp_path / "repo" / ".venv").exists()


def test_an_existing_dot_venv_is_used_again(tmp_path):
    fake_python(tmp_path / "repo" / ".venv" / "bin" / "python", version="3.12")
    result, calls = run_setup(tmp_path, pythons={"python3": dict(ensurepip=False)})  # venv's needs don't matter
    assert result.returncode == 0, result.stderr
    assert calls == [".venv/bin/python -c", PIP]


@pytest.mark.parametrize(
    "content, message",
    [
        ("folder", ".venv is not a virtualenv (no .venv/bin/python): remove it (rm -rf .venv) and run setup.sh again"),
        (
            "3.10",
            ".venv has Python 3.10, ppo-lab needs 3.11 or later: remove .venv (rm -rf .venv) and run setup.sh again",
        ),
    ],
)
def test_an_existing_dot_venv_that_cannot_be_used_is_one_line(tmp_path, content, message):
    venv = tmp_path / "repo" / ".venv"
    if content == "folder":
        venv.mkdir(parents=True)
    else:
        fake_python(venv / "bin" / "python", version=content)
    result, calls = run_setup(tmp_path)
    assert error_line(result) == f"setup.sh: error: {message}"
    assert PIP not in calls and VENV not in calls


def test_a_dot_venv_link_left_by_an_earlier_setup_installs_into_that_environment_again(tmp_path):
    """setup.sh run inside an activated env, later again in a new shell: .venv still names that env."""
    fake_python(tmp_path / "env" / "bin" / "python")
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / ".venv").symlink_to(tmp_path / "env")
    result, calls = run_setup(tmp_path)
    assert result.returncode == 0, result.stderr
    assert calls == [".venv/bin/python -c", ENV_PIP]
    assert (tmp_path / "repo" / ".venv").resolve() == (tmp_path / "env").resolve()


def test_a_dot_venv_link_to_an_environment_that_is_gone_is_replaced_by_a_new_venv(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / ".venv").symlink_to(tmp_path / "gone")
    result, calls = run_setup(tmp_path)
    assert result.returncode == 0, result.stderr
    assert calls == [PROBE, VENV, PIP]
    assert not (tmp_path / "repo" / ".venv").is_symlink()


# Inside an activated virtualenv or conda env: installs into it, .venv links to it --------------------------------


@pytest.mark.parametrize(
    "variables",
    [
        dict(VIRTUAL_ENV="{env}"),
        dict(CONDA_PREFIX="{env}", CONDA_DEFAULT_ENV="ppo"),
        # a virtualenv made inside conda's base env: the virtualenv, the inner one
        dict(VIRTUAL_ENV="{env}", CONDA_PREFIX="{tmp}/conda", CONDA_DEFAULT_ENV="base"),
    ],
)
def test_an_activated_environment_is_installed_into_and_dot_venv_links_to_it(tmp_path, variables):
    env_dir = tmp_path / "env"
    fake_python(env_dir / "bin" / "python", version="3.13")
    env = {key: value.format(env=env_dir, tmp=tmp_path) for key, value in variables.items()}
    # the system's python3 is neither needed nor looked at: no venv, no python3-venv
    result, calls = run_setup(tmp_path, qt=True, pythons={"python3": dict(ensurepip=False)}, env=env)
    assert result.returncode == 0, result.stderr
    assert calls == ["env/bin/python -c", ENV_PIP]
    venv = tmp_path / "repo" / ".venv"
    assert venv.is_symlink() and venv.resolve() == env_dir.resolve()
    assert f"installing requirements.txt into .venv -> {env_dir.resolve()}" in result.stdout


def test_conda_base_is_left_alone_for_a_dot_venv(tmp_path):
    """conda's base env is active in every shell by default: installing there could break conda itself."""
    fake_python(tmp_path / "conda" / "bin" / "python")
    result, calls = run_setup(tmp_path, env=dict(CONDA_PREFIX=str(tmp_path / "conda"), CONDA_DEFAULT_ENV="base"))
    assert result.returncode == 0, result.stderr
    assert calls == [PROBE, VENV, PIP]
    assert not (tmp_path / "repo" / ".venv").is_symlink()


def test_a_dot_venv_link_is_repointed_to_the_activated_environment(tmp_path):
    for name in ("old", "new"):
        fake_python(tmp_path / name / "bin" / "python")
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / ".venv").symlink_to(tmp_path / "old")
    result, calls = run_setup(tmp_path, env=dict(VIRTUAL_ENV=str(tmp_path / "new")))
    assert result.returncode == 0, result.stderr
    assert calls == ["new/bin/python -c", f"new/bin/python {PIP_ARGS}"]
    assert (tmp_path / "repo" / ".venv").resolve() == (tmp_path / "new").resolve()


def test_a_dot_venv_of_its_own_beside_an_activated_environment_is_one_line(tmp_path):
    fake_python(tmp_path / "env" / "bin" / "python")
    fake_python(tmp_path / "repo" / ".venv" / "bin" / "python")
    result, calls = run_setup(tmp_path, env=dict(VIRTUAL_ENV=str(tmp_path / "env")))
    assert error_line(result) == (
        f"setup.sh: error: .venv is a virtualenv of its own, not the active environment "
        f"{tmp_path}/env: remove it (rm -rf .venv) to install into {tmp_path}/env, or "
        "deactivate to use .venv"
    )
    assert PIP not in calls and not (tmp_path / "repo" / ".venv").is_symlink()


def test_the_activated_dot_venv_itself_is_installed_into(tmp_path):
    """`source .venv/bin/activate`, then setup.sh again."""
    fake_python(tmp_path / "repo" / ".venv" / "bin" / "python")
    result, calls = run_setup(tmp_path, env=dict(VIRTUAL_ENV=str(tmp_path / "repo" / ".venv")))
    assert result.returncode == 0, result.stderr
    assert calls == ["repo/.venv/bin/python -c", PIP]
    assert not (tmp_path / "repo" / ".venv").is_symlink()


def test_an_activated_environment_with_an_old_python_is_one_line(tmp_path):
    fake_python(tmp_path / "env" / "bin" / "python", version="3.10")
    result, calls = run_setup(tmp_path, env=dict(VIRTUAL_ENV=str(tmp_path / "env")))
    assert error_line(result) == (
        f"setup.sh: error: the active environment {tmp_path}/env has Python 3.10, ppo-lab "
        "needs 3.11 or later: activate one with Python 3.11+, or deactivate it and run "
        "setup.sh again to make .venv"
    )
    assert PIP not in calls and not (tmp_path / "repo" / ".venv").exists()


def test_an_activated_environment_without_pip_gets_it_from_ensurepip(tmp_path):
    """uv's virtualenvs and some conda envs come without pip."""
    fake_python(tmp_path / "env" / "bin" / "python", pip=False)
    result, calls = run_setup(tmp_path, env=dict(VIRTUAL_ENV=str(tmp_path / "env")))
    assert result.returncode == 0, result.stderr
    assert calls == ["env/bin/python -c", "env/bin/python -m ensurepip --default-pip", ENV_PIP]


# Without network: --wheelhouse DIR on a machine with network, --offline DIR on the machine without ----------------


def wheelhouse_calls(wheels, *extra):
    """The download of requirements.txt and of pyproject.toml's build requirements into `wheels`."""
    download = f"repo/.venv/bin/python -m pip download --quiet --disable-pip-version-check --dest {wheels}"
    return f"{download}{''.join(' ' + e for e in extra)} --find-links {wheels} -r requirements.txt setuptools>=68"


def test_wheelhouse_downloads_what_the_install_would_install_and_installs_nothing(tmp_path):
    """Neither apt-get (the system packages are the other machine's business) nor pip install."""
    result, calls = run_setup(tmp_path, qt=False, redis=False, args=["--wheelhouse", "wheels"])
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "wheels").is_dir()  # where setup.sh was called from
    assert calls == [PROBE, VENV, wheelhouse_calls("wheels")]  # (an absolute path: the calls' are relative)
    assert f"bash setup.sh --offline {tmp_path}/wheels" in result.stdout


def test_wheelhouse_takes_torch_from_the_index_given_and_wheels_for_another_python(tmp_path):
    index = "https://download.pytorch.org/whl/cu128"
    args = ["--wheelhouse", "wheels", "--torch-index", index, "--python-version", "3.12"]
    result, calls = run_setup(tmp_path, args=args)
    assert result.returncode == 0, result.stderr
    wheels, for_312 = "wheels", "--python-version 3.12 --only-binary=:all:"
    torch = wheelhouse_calls(wheels, for_312).split(" --find-links")[0] + f" --index-url {index} torch==2.13.0"
    assert calls == [PROBE, VENV, torch, wheelhouse_calls(wheels, for_312)]


def test_wheelhouse_takes_the_torch_index_from_the_environment_and_no_torch_where_it_keeps_the_one_there(tmp_path):
    index = "https://download.pytorch.org/whl/cpu"
    result, calls = run_setup(tmp_path, env={"PPO_LAB_TORCH_INDEX": index}, args=["--wheelhouse", "w"])
    assert result.returncode == 0, result.stderr
    assert calls[2].endswith(f"--index-url {index} torch==2.13.0") and len(calls) == 4
    shutil.rmtree(tmp_path / "repo")
    (tmp_path / "calls").unlink()
    shutil.rmtree(tmp_path / "bin")
    args = ["--wheelhouse", "w", "--keep-torch"]
    result, calls = run_setup(tmp_path, env={"PPO_LAB_TORCH_INDEX": index}, args=args)
    assert result.returncode == 0, result.stderr
    assert len(calls) == 3 and not any("torch" in call for call in calls)
    assert re.search(r" -r /\S+\.txt setuptools>=68$", calls[-1])  # requirements.txt less its torch line


def test_offline_installs_from_the_folder_alone_and_names_the_system_packages_it_cannot_get(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    result, calls = run_setup(tmp_path, qt=False, redis=False, args=["--offline", str(wheels)])
    assert result.returncode == 0, result.stderr
    assert calls == [PROBE, VENV, PIP.replace(" -r ", " --no-index --find-links wheels -r ")]
    assert "not installed without network: libqt5gui5 redis-server" in result.stdout


def test_offline_keeps_the_environments_torch_when_asked(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    result, calls = run_setup(tmp_path, args=["--offline", str(wheels), "--keep-torch"])
    assert result.returncode == 0, result.stderr
    offline = "--quiet --disable-pip-version-check --no-index --find-links wheels"
    assert calls[:3] == [PROBE, VENV, "repo/.venv/bin/python -c"]  # torch is there to keep
    assert re.fullmatch(rf"repo/\.venv/bin/python -m pip install {offline} -r /\S+\.txt", calls[3]), calls[3]
    assert calls[4:] == [f"repo/.venv/bin/python -m pip install {offline} --no-deps -e ."]


def write_wheel(folder, name, version, files):
    """A pure-Python wheel of `name` `version` in `folder`: `files` ({path: text}) and its .dist-info."""
    info = f"{name}-{version}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test_setup\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
        wheel.writestr(f"{info}/RECORD", "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"]))


# tinybuild, a build backend: it builds the project in its folder as an editable wheel (a .pth file naming the folder)
# whose summary names the tinybuild version that built it
BACKEND = r"""
import os
import zipfile


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    info, name = "fakelab-0.1.dist-info", "fakelab-0.1-py3-none-any.whl"
    files = {
        "fakelab.pth": os.getcwd() + "\n",
        info + "/METADATA": f"Metadata-Version: 2.1\nName: fakelab\nVersion: 0.1\nSummary: tinybuild {VERSION}\n",
        info + "/WHEEL": "Wheel-Version: 1.0\nGenerator: tinybuild\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        info + "/RECORD": "",
    }
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    return name
"""


def tiny_wheels(folder, version):
    """tinypkg (the project's requirement) and tinybuild (what it builds with), both `version`, in `folder`."""
    write_wheel(folder, "tinypkg", version, {"tinypkg.py": f"VERSION = {version!r}\n"})
    write_wheel(folder, "tinybuild", version, {"tinybuild.py": f"VERSION = {version!r}\n{BACKEND}"})
    return folder


def simple_index(folder, version):
    """A PEP 503 index (file://) listing the tiny wheels of `version`."""
    tiny_wheels(folder / "files", version)
    for name in ("tinypkg", "tinybuild"):
        wheel = folder / "files" / f"{name}-{version}-py3-none-any.whl"
        (folder / name).mkdir(parents=True)
        (folder / name / "index.html").write_text(f'<a href="{wheel.as_uri()}">{wheel.name}</a>\n')
    return folder.as_uri()


def pip_conf(path, find_links, index_url):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"[global]\nfind-links = {find_links}\nindex-url = {index_url}\n")
    return str(path)


@pytest.mark.parametrize("configured_in", ["variables", "files"])
def test_offline_installs_from_dir_alone_whatever_pip_is_configured_with(tmp_path, configured_in):
    """For real, with a real Python and pip: DIR holds tinypkg 1.0 and tinybuild 1.0 (the project's build backend);
    pip's configuration names decoys, newer versions of both (which pip would prefer), each channel its own version:
    find-links and indexes in PIP_* variables and in a PIP_CONFIG_FILE, then in the user's and the global pip.conf
    (an index that is a closed port: reaching for it would be reaching for the network). The installed versions say
    where every wheel came from, the one installed (tinypkg) and the one the editable build installed (tinybuild)."""
    wheels = tiny_wheels(tmp_path / "wheels", "1.0")
    decoys, closed = tmp_path / "decoys", "http://127.0.0.1:9/simple"
    home = tmp_path / "home"
    env = dict(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_CONFIG_DIRS=str(tmp_path / "etc"))
    if configured_in == "variables":
        env.update(
            PIP_FIND_LINKS=str(tiny_wheels(decoys / "find_links", "2.1")),
            PIP_INDEX_URL=simple_index(decoys / "index", "2.2"),
            PIP_EXTRA_INDEX_URL=simple_index(decoys / "extra_index", "2.3"),
            PIP_CONFIG_FILE=pip_conf(tmp_path / "pip.conf", tiny_wheels(decoys / "config_file", "2.4"), closed),
        )
    else:
        pip_conf(home / ".config" / "pip" / "pip.conf", tiny_wheels(decoys / "user", "2.5"), closed)
        pip_conf(tmp_path / "etc" / "pip" / "pip.conf", tiny_wheels(decoys / "global", "2.6"), closed)
    files = {
        "requirements.txt": "tinypkg\n",
        "pyproject.toml": '[build-system]\nrequires = ["tinybuild"]\nbuild-backend = "tinybuild"\n',
        "fakelab/__init__.py": "",
    }
    python = Path(shutil.which("python3", path=f"{sys.base_prefix}/bin") or sys.executable)
    result, _ = run_setup(
        tmp_path, pythons={"python3": python}, env=env, files=files, args=["--offline", str(wheels)], timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    check = subprocess.run(
        [
            str(tmp_path / "repo" / ".venv" / "bin" / "python"),
            "-c",
            "import importlib.metadata as m, fakelab, tinypkg\n"
            "print(tinypkg.VERSION, m.version('tinypkg'), m.metadata('fakelab')['Summary'], fakelab.__file__)",
        ],
        cwd=tmp_path,
        env=dict(PATH=os.environ["PATH"]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    fakelab = tmp_path / "repo" / "fakelab" / "__init__.py"
    assert check.stdout.split() == ["1.0", "1.0", "tinybuild", "1.0", str(fakelab)]  # (2.x: that decoy's channel)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--offline"], "--offline needs a folder: bash setup.sh [--wheelhouse"),
        (["--wheelhouse", "--keep-torch"], "--wheelhouse needs a folder: bash setup.sh [--wheelhouse"),
        (["--offline", "empty"], "--offline empty: no wheels there (make them with bash setup.sh --wheelhouse empty"),
        (["--wheelhouse", "a", "--offline", "b"], "give one of --wheelhouse DIR and --offline DIR: bash setup.sh"),
        (["--torch-index", "cu128"], "--torch-index needs a URL, e.g. https://download.pytorch.org/whl/cu128: bash"),
        (["--wheelhouse", "w", "--python-version", "312"], "--python-version needs a version such as 3.12: bash"),
        (["--python-version", "3.12"], "--python-version is for --wheelhouse DIR only: bash setup.sh"),
        (["--offline", "w", "--torch-index", "https://x.org/whl"], "--offline installs torch from DIR: leave out"),
        (["--wheelhous", "w"], "unknown argument '--wheelhous': bash setup.sh [--wheelhouse DIR"),
    ],
)
def test_bad_options_are_one_line_before_anything_is_done(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "x-1-py3-none-any.whl").touch()
    result, calls = run_setup(tmp_path, qt=False, args=args)
    assert error_line(result).startswith(f"setup.sh: error: {message}")
    assert calls == [] and not (tmp_path / "repo" / ".venv").exists()


def test_help_prints_the_header_and_does_nothing(tmp_path):
    result, calls = run_setup(tmp_path, args=["--help"])
    assert result.returncode == 0, result.stderr
    assert "bash setup.sh --offline DIR" in result.stdout and "--torch-index URL" in result.stdout
    assert calls == []


# For real: pyproject.toml, uv, .ci/run ----------------------------------------------------------------------------


def requirement_set(lines):
    """{(name, sorted extras, specifier)} of requirement lines, comments and spelling normalised."""
    found = set()
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            name, extras, spec = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?\s*(.*)", line).groups()
            found.add(
                (
                    re.sub(r"[-_.]+", "-", name).lower(),
                    tuple(sorted(e.strip() for e in (extras or "").split(",") if e.strip())),
                    spec.replace(" ", ""),
                )
            )
    return found


def pip_would_install(report: Path, *targets) -> list[dict]:
    """What `pip install --dry-run --no-deps --ignore-installed targets...` would install, read from its JSON report
    (written to `report`)."""
    command = ["--dry-run", "--no-deps", "--ignore-installed", "--quiet", "--report", str(report), *targets]
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", *command], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return json.loads(report.read_text())["install"]


def test_pip_install_e_reads_the_pins_of_requirements_txt(tmp_path):
    """`pip install -e .` (pip's own reading of pyproject.toml, through its build backend): the same requirements,
    one for one, as requirements.txt."""
    (project,) = pip_would_install(tmp_path / "report.json", "-e", str(REPO))
    assert project["metadata"]["name"] == "ppo-lab"
    pinned = requirement_set((REPO / "requirements.txt").read_text().splitlines())
    assert len(pinned) > 10 and all(spec.startswith("==") for _, _, spec in pinned)
    assert requirement_set(project["metadata"]["requires_dist"]) == pinned


def torch_index(tmp_path):
    """A package index holding the torch wheel that pip installs for this environment's torch version: given to uv
    first, it makes uv take the same torch build (here the local CPU wheel, which uv's resolver would otherwise pass
    over for PyPI's build of the same version: CUDA, several GB on Linux). It lives in one place for every run, so
    uv unpacks that wheel into its cache once, not once per run."""
    import torch

    (wheel,) = pip_would_install(tmp_path / "torch.json", f"torch=={torch.__version__}")
    url = wheel["download_info"]["url"]
    index = Path(tempfile.gettempdir()) / "ppo-lab-torch-index" / torch.__version__
    page, text = index / "torch" / "index.html", f'<a href="{url}">{url.rsplit("/", 1)[1]}</a>\n'
    if not page.exists() or page.read_text() != text:
        page.parent.mkdir(parents=True, exist_ok=True)
        draft = page.with_name(f"index.html.{os.getpid()}")
        draft.write_text(text)
        os.replace(draft, page)  # whole, for a run beside this one
    return index.as_uri(), torch.__version__


def test_uv_run_trains_cartpole_with_the_pinned_packages(tmp_path):
    """`uv run ppo.py` in a copy of the project: uv makes its own environment from pyproject.toml (the pins of
    requirements.txt) and the script trains. The torch build is this environment's (see torch_index)."""
    import uv

    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "requirements.txt", "ppo.py"):
        shutil.copy(REPO / name, project)
    shutil.copytree(REPO / "ppolab", project / "ppolab", ignore=shutil.ignore_patterns("__pycache__"))
    index, torch_version = torch_index(tmp_path)
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("UV_", "VIRTUAL_ENV", "CONDA", "PYTHON"))
    }
    # the system's certificates, as pip uses them (a machine behind a proxy with its own CA has it there)
    env.update(
        UV_INDEX=index, UV_PYTHON=sys.executable, UV_PYTHON_DOWNLOADS="never", UV_SYSTEM_CERTS="1", OMP_NUM_THREADS="1"
    )
    result = subprocess.run(
        [
            uv.find_uv_bin(),
            "run",
            "--quiet",
            "ppo.py",
            "--total-timesteps",
            "1024",
            "--num-envs",
            "2",
            "--runs-dir",
            str(tmp_path / "runs"),
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "iteration 4/4 global_step=1024" in result.stdout, result.stdout
    uv_python = project / ".venv" / "bin" / "python"
    check = subprocess.run(
        [
            str(uv_python),
            "-c",
            "import torch, gymnasium, envpool; print(torch.__version__, gymnasium.__version__, envpool.__version__)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    pins = {name: spec[2:] for name, _, spec in requirement_set((REPO / "requirements.txt").read_text().splitlines())}
    assert check.stdout.split() == [torch_version, pins["gymnasium"], pins["envpool"]], check.stderr
    assert torch_version.split("+")[0] == pins["torch"]


def readme_setup_blocks():
    """The bash code blocks of the README's "## Setup" section."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Setup\n", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_ci_runs_the_readme_commands_with_the_system_python():
    """.ci/run: the README's setup on a PATH of system folders only (python3 is the system's), no activated
    environment, then the README's test command exactly as written."""
    install, tests = readme_setup_blocks()[:2]
    assert install.startswith("bash setup.sh && .venv/bin/python ppo.py")
    ci = [
        line.strip()
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    system_path = "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert ci.index(system_path) < ci.index("bash setup.sh") < ci.index(tests) == len(ci) - 1
    assert "unset VIRTUAL_ENV CONDA_PREFIX CONDA_DEFAULT_ENV PYTHONHOME PYTHONPATH" in ci[: ci.index("bash setup.sh")]


def test_a_script_copied_to_another_folder_runs_with_the_installed_package(tmp_path):
    """setup.sh installs ppolab (`pip install -e .`), so a script copied out of the repository (to change it for
    an experiment) runs from anywhere with the environment's Python; without the package it would fail to import
    ppolab."""
    shutil.copy(REPO / "ppo.py", tmp_path / "my_ppo.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    argv = ["--total-timesteps", "256", "--num-steps", "32", "--no-cuda", "--runs-dir", str(tmp_path / "runs")]
    result = subprocess.run(
        [sys.executable, "my_ppo.py", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("CartPole-v1__my_ppo__1__") and list(run_dir.glob("events.out.tfevents.*"))
