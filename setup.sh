#!/usr/bin/env bash
# Installs what ppo-lab needs on Debian/Ubuntu, as root (a container) or as a user with sudo:
#   bash setup.sh
# 1. the system packages, only those missing: the Qt 5 runtime (envpool's Procgen, ppo_procgen.py)
#    and the Redis server (ppo_continuous_action_redis.py);
# 2. the Python packages of requirements.txt, with the pip of the `python3` on PATH.
# .ci/run runs this file, so CI proves the README's setup.
set -euo pipefail
cd "$(dirname "$0")"

missing=()
ldconfig -p | grep -q libQt5Gui.so.5 || missing+=(libqt5gui5)
command -v redis-server > /dev/null || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
    # root (the usual container) has no sudo and needs none; a user needs sudo for apt-get
    if [ "$(id -u)" -eq 0 ]; then
        as_root=()
    elif command -v sudo > /dev/null; then
        as_root=(sudo)
    else
        echo "setup.sh: error: ${missing[*]} missing, and neither root nor sudo to install them" >&2
        exit 1
    fi
    echo "setup.sh: installing ${missing[*]}"
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi
python3 -m pip install --quiet --disable-pip-version-check -r requirements.txt
