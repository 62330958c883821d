#!/usr/bin/env bash
# Installs what ppo-lab needs on Debian/Ubuntu, as root (a container) or as a user with sudo:
#   bash setup.sh            then: .venv/bin/python ppo.py
# 1. the Python environment, found in this order:
#    - an activated virtualenv ($VIRTUAL_ENV) or conda env ($CONDA_PREFIX, not conda's base): setup
#      installs into it and makes .venv a link to it;
#    - else the project virtualenv .venv, made (once) with the first Python 3.11+ on PATH (python3,
#      python3.13, python3.12, python3.11): a stock Debian/Ubuntu python3 (PEP 668, no `python`) is fine;
#    so .venv/bin/python is the environment's Python in every case;
# 2. the system packages, only those missing: the Qt 5 runtime (envpool's Procgen, ppo_procgen.py),
#    the Redis server (ppo_continuous_action_redis.py), and python3.X-venv when venv can't make .venv;
# 3. the Python packages of requirements.txt, with that environment's pip, and ppolab itself (pip install -e .).
# Anything missing that setup can't get is one line on stderr and exit 1. .ci/run runs this file with
# the system's python3, so CI proves the README's setup.
#
# For a machine without network (docs/install.md, "Without network"):
#   bash setup.sh --wheelhouse DIR   on a machine with network: steps 1 and 3, but the packages (requirements.txt's,
#                                    and what `pip install -e .` builds with) are downloaded into DIR, not installed
#       --torch-index URL            torch from this package index (e.g. https://download.pytorch.org/whl/cu128 or
#                                    .../whl/cpu; default: pip's own, $PPO_LAB_TORCH_INDEX if set); also without
#                                    --wheelhouse, where it installs torch from there before the rest
#       --python-version X.Y         wheels for another Python than this one (that of the machine without network)
#   bash setup.sh --offline DIR      on the machine without network: steps 1 to 3 from DIR alone (pip --no-index,
#                                    pip's configuration ignored: PIP_* variables, pip.conf files); missing system
#                                    packages are named, not installed
#   --keep-torch                     with any of them: the environment's own torch stays (a cluster's CUDA build);
#                                    requirements.txt's torch is neither downloaded nor installed
set -euo pipefail

fail() { echo "setup.sh: error: $*" >&2; exit 1; }

# 0. The options ----------------------------------------------------------------------------------------
usage="bash setup.sh [--wheelhouse DIR [--python-version X.Y] | --offline DIR] [--torch-index URL] [--keep-torch]"
mode=install      # or wheelhouse, offline
wheels=""         # their folder
torch_index=${PPO_LAB_TORCH_INDEX:-}
python_version="" keep_torch=""
while [ $# -gt 0 ]; do
    case $1 in
        --wheelhouse | --offline)
            [ "$mode" = install ] || fail "give one of --wheelhouse DIR and --offline DIR: $usage"
            { [ $# -ge 2 ] && [ -n "$2" ] && [ "${2#-}" = "$2" ]; } || fail "$1 needs a folder: $usage"
            mode=${1#--} wheels=$2
            shift 2 ;;
        --torch-index)
            { [ $# -ge 2 ] && [[ $2 =~ ^(https?|file)://. ]]; } || fail "--torch-index needs a URL, e.g. https://download.pytorch.org/whl/cu128: $usage"
            torch_index=$2
            shift 2 ;;
        --python-version)
            { [ $# -ge 2 ] && [[ $2 =~ ^3\.[0-9]+$ ]]; } || fail "--python-version needs a version such as 3.12: $usage"
            python_version=$2
            shift 2 ;;
        --keep-torch) keep_torch=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
        *) fail "unknown argument '$1': $usage" ;;
    esac
done
if [ -n "$python_version" ] && [ "$mode" != wheelhouse ]; then
    fail "--python-version is for --wheelhouse DIR only: $usage"
fi
if [ "$mode" = offline ]; then
    [ -z "$torch_index" ] || fail "--offline installs torch from DIR: leave out --torch-index (and PPO_LAB_TORCH_INDEX)"
    compgen -G "$wheels/*.whl" > /dev/null || fail "--offline $wheels: no wheels there (make them with bash setup.sh --wheelhouse $wheels on a machine with network)"
    wheels=$(cd "$wheels" && pwd)
elif [ "$mode" = wheelhouse ]; then
    mkdir -p "$wheels" 2> /dev/null || fail "--wheelhouse $wheels: cannot make that folder"
    wheels=$(cd "$wheels" && pwd)
fi
cd "$(dirname "$0")"  # (the folders above are the caller's: relative to where setup.sh was called from)
# requirements.txt's torch line; requirements.txt without it, where the environment's own torch stays
requirement_lines() {  # the lines of requirements.txt that are (yes) or are not (no) torch's, comments left out
    local line
    while IFS= read -r line || [ -n "$line" ]; do
        line=${line%%#*}
        line=${line//[[:space:]]/}
        [ -n "$line" ] || continue
        if [[ $line =~ ^torch[=\<\>~!] ]]; then [ "$1" = no ] || echo "$line"; else [ "$1" = yes ] || echo "$line"; fi
    done < requirements.txt
    return 0
}
requirements=requirements.txt
if [ -n "$keep_torch" ]; then
    requirements=${TMPDIR:-/tmp}/ppo-lab-requirements.$$.txt
    trap 'rm -f "$requirements"' EXIT
    requirement_lines no > "$requirements"
fi

# "3.11 1 1": a Python's version, whether it has ensurepip (venv needs it; on Debian/Ubuntu it comes with
# python3.X-venv) and pip; nothing when it doesn't run
probe() {
    "$1" -c 'import sys, importlib.util as u; print("%d.%d" % sys.version_info[:2], *(int(bool(u.find_spec(m))) for m in ("ensurepip", "pip")))' 2> /dev/null || true
}
supported() { [ "${1%%.*}" -eq 3 ] && [ "${1#*.}" -ge 11 ]; }  # 3.11 and later

# 1. The environment: an active one, or .venv ----------------------------------------------------------
env_prefix=""
if [ -n "${VIRTUAL_ENV:-}" ]; then
    env_prefix=$VIRTUAL_ENV
elif [ -n "${CONDA_PREFIX:-}" ] && [ "${CONDA_DEFAULT_ENV:-}" != base ]; then
    env_prefix=$CONDA_PREFIX  # (conda's base env, active in every shell by default, is left alone)
fi
make_venv=""
if [ -n "$env_prefix" ]; then
    python=$env_prefix/bin/python
    read -r version has_ensurepip has_pip <<< "$(probe "$python")"
    [ -n "$version" ] || fail "the active environment $env_prefix has no working bin/python: deactivate it, or fix it"
    supported "$version" || fail "the active environment $env_prefix has Python $version, ppo-lab needs 3.11 or later: activate one with Python 3.11+, or deactivate it and run setup.sh again to make .venv"
    if [ -L .venv ] || [ ! -e .venv ]; then
        ln -sfn "$env_prefix" .venv
    elif [ "$(cd -P .venv && pwd)" != "$(cd -P "$env_prefix" && pwd)" ]; then
        fail ".venv is a virtualenv of its own, not the active environment $env_prefix: remove it (rm -rf .venv) to install into $env_prefix, or deactivate to use .venv"
    fi
else
    if [ -L .venv ] && [ ! -e .venv ]; then
        rm .venv  # a link to an environment that is gone
    fi
    if [ -e .venv ]; then  # made by an earlier setup.sh, or a link to the env it installed into
        [ -x .venv/bin/python ] || fail ".venv is not a virtualenv (no .venv/bin/python): remove it (rm -rf .venv) and run setup.sh again"
        python=.venv/bin/python
        read -r version has_ensurepip has_pip <<< "$(probe "$python")"
        [ -n "$version" ] || fail ".venv/bin/python does not run (was the Python it was made with removed?): remove .venv (rm -rf .venv) and run setup.sh again"
        supported "$version" || fail ".venv has Python $version, ppo-lab needs 3.11 or later: remove .venv (rm -rf .venv) and run setup.sh again"
    else
        tried=()
        for candidate in python3 python3.13 python3.12 python3.11; do
            command -v "$candidate" > /dev/null || continue
            read -r version has_ensurepip has_pip <<< "$(probe "$candidate")"
            tried+=("$candidate is ${version:-broken}")
            if [ -n "$version" ] && supported "$version"; then
                python=$(command -v "$candidate")
                make_venv=1
                break
            fi
        done
        if [ -z "$make_venv" ]; then
            [ ${#tried[@]} -gt 0 ] || tried=("no python3 on PATH")
            fail "ppo-lab needs Python 3.11 or later (${tried[*]}): install one (Debian 12, Ubuntu 24.04: apt-get install python3 python3-venv; Ubuntu 22.04: apt-get install python3.11 python3.11-venv) or activate a virtualenv or conda env that has one"
        fi
    fi
fi

# 2. The system packages that are missing --------------------------------------------------------------
missing=()
if [ -n "$make_venv" ] && [ "$has_ensurepip" != 1 ]; then
    missing+=("python$version-venv")  # Debian/Ubuntu ship venv's ensurepip in its own package
fi
if [ "$mode" != wheelhouse ]; then  # (downloading needs neither)
    ldconfig -p 2> /dev/null | grep -q libQt5Gui.so.5 || missing+=(libqt5gui5)
    command -v redis-server > /dev/null || missing+=(redis-server)
fi
if [ "$mode" = offline ] && [ ${#missing[@]} -gt 0 ]; then  # no apt-get without network
    [ "${missing[0]}" != "python$version-venv" ] || fail "python$version-venv missing, and no network to install it: install it with your system's package manager, or activate a virtualenv or conda env and run setup.sh again"
    echo "setup.sh: not installed without network: ${missing[*]} (libqt5gui5 for ppo_procgen.py, redis-server for ppo_continuous_action_redis.py): install them with your system's package manager"
elif [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get > /dev/null || fail "${missing[*]} missing, and no apt-get to install them (not Debian/Ubuntu?): install their equivalents with your system's package manager"
    # root (the usual container) has no sudo and needs none; a user needs sudo for apt-get
    if [ "$(id -u)" -eq 0 ]; then
        as_root=()
    elif command -v sudo > /dev/null; then
        as_root=(sudo)
    else
        fail "${missing[*]} missing, and neither root nor sudo to install them: ask an administrator to run apt-get install ${missing[*]}"
    fi
    echo "setup.sh: installing ${missing[*]}"
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi

# 3. The Python packages ---------------------------------------------------------------------------------
if [ -n "$make_venv" ]; then
    echo "setup.sh: making .venv with $python (Python $version)"
    if ! error=$("$python" -m venv .venv 2>&1); then
        rm -rf .venv
        read -r -d '' -a words <<< "$error" || true  # its message on one line
        fail "$python -m venv .venv failed (${words[*]}): install python$version-venv, or activate a virtualenv or conda env and run setup.sh again"
    fi
    python=.venv/bin/python
elif [ "${has_pip:-}" != 1 ]; then
    "$python" -m ensurepip --default-pip > /dev/null 2>&1 || fail "$python has no pip: install it into that environment (conda install pip, or uv pip install pip) and run setup.sh again"
fi
# with the environment's own path, which pip writes into the commands it installs (bin/tensorboard, bin/torchrun):
# a path through the link .venv would break them for the environment's other projects once this folder moves
prefix=$(cd -P .venv && pwd)
if [ -L .venv ]; then where=".venv -> $prefix"; else where=.venv; fi
pip=("$prefix/bin/python" -m pip)
quiet=(--quiet --disable-pip-version-check)
if [ -n "$keep_torch" ] && [ "$mode" != wheelhouse ]; then
    "$prefix/bin/python" -c "import torch" 2> /dev/null || fail "--keep-torch: $where has no torch to keep: install one first, or leave out --keep-torch"
fi
if [ "$mode" = wheelhouse ]; then
    echo "setup.sh: downloading requirements.txt's packages and ppolab's build requirements into $wheels"
    download=("${pip[@]}" download "${quiet[@]}" --dest "$wheels")
    if [ -n "$python_version" ]; then
        download+=(--python-version "$python_version" --only-binary=:all:)
    fi
    if [ -n "$torch_index" ] && [ -z "$keep_torch" ]; then  # torch first, from its index: the rest finds it there
        "${download[@]}" --index-url "$torch_index" "$(requirement_lines yes)"
    fi
    # what `pip install -e .` builds with: pyproject.toml's [build-system] requires (one line, as written there)
    build=""
    while IFS= read -r line; do
        if [[ $line =~ ^requires\ =\ \[(.*)\] ]]; then build=${BASH_REMATCH[1]//\"/}; fi
    done < pyproject.toml
    IFS=", " read -r -a build <<< "$build"
    "${download[@]}" --find-links "$wheels" -r "$requirements" "${build[@]}"
    # a package with no wheel comes as its source: built here, where its build requirements can be downloaded
    for source in "$wheels"/*.tar.gz "$wheels"/*.zip; do
        [ -e "$source" ] || continue
        "${pip[@]}" wheel "${quiet[@]}" --no-deps --wheel-dir "$wheels" "$source"
        rm "$source"
    done
    echo "setup.sh: done; on the machine without network, with this folder and $wheels: bash setup.sh --offline $wheels"
    exit 0
fi
from=()
if [ "$mode" = offline ]; then
    # DIR and nothing else. pip adds the find-links of its configuration (PIP_FIND_LINKS, a pip.conf) to the
    # command's, even with --no-index, so none is read: every PIP_* variable unset, no config file (global, user,
    # site). Unset here, they are gone for the pip that pip runs to build ppolab too. (setup.sh doesn't use uv.)
    unset $(compgen -e -X '!PIP_*')
    export PIP_CONFIG_FILE=/dev/null
    from=(--no-index --find-links "$wheels")
    echo "setup.sh: installing requirements.txt into $where from $wheels alone"
else
    echo "setup.sh: installing requirements.txt into $where (a few minutes the first time)"
    if [ -n "$torch_index" ] && [ -z "$keep_torch" ]; then
        "${pip[@]}" install "${quiet[@]}" --index-url "$torch_index" "$(requirement_lines yes)"
    fi
fi
# and the package ppolab, editable (this folder's code): a script copied to any folder runs with this Python
if [ -n "$keep_torch" ]; then  # (-e . would ask for requirements.txt's torch)
    "${pip[@]}" install "${quiet[@]}" "${from[@]}" -r "$requirements"
    "${pip[@]}" install "${quiet[@]}" "${from[@]}" --no-deps -e .
else
    "${pip[@]}" install "${quiet[@]}" "${from[@]}" -r requirements.txt -e .
fi
echo "setup.sh: done; run a script with .venv/bin/python, e.g. .venv/bin/python ppo.py"
