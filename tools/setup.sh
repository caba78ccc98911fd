#!/usr/bin/env bash
# Set up int8jit on a Debian machine (as root, or with sudo available) and run a job.
#
#   bash tools/setup.sh demo     # the main job: probe the CPU, build and run every ISA path
#   bash tools/setup.sh test     # the whole test suite
#   bash tools/setup.sh bench gemm ...   # benchmarks (installs the oneDNN peer too)
#   bash tools/setup.sh env      # only set up; prints the virtual environment's python
#
# It installs what is missing and nothing else, so a second run is quick:
# Debian's python3, python3-venv and python3-peachpy (PyPI's peachpy is broken), a
# virtual environment .venv with system site packages (so Debian's PeachPy is visible),
# and this package in editable mode with its test and peer extras.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
job="${1:-demo}"
[ $# -gt 0 ] && shift
sys_python=/usr/bin/python3
venv="$root/.venv"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
[ -x "$sys_python" ] || missing+=(python3)
if [ -x "$sys_python" ]; then
    "$sys_python" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
    "$sys_python" -c 'import peachpy.x86_64' 2>/dev/null || missing+=(python3-peachpy)
else
    missing+=(python3-venv python3-peachpy)
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq >&2
    as_root apt-get install -y -qq "${missing[@]}" >&2
fi

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import peachpy.x86_64' 2>/dev/null; then
    echo "setup: creating $venv" >&2
    rm -rf "$venv"
    "$sys_python" -m venv --system-site-packages "$venv"
fi

extras="test,peers"
stamp="$venv/.int8jit-installed"
want="$(sha256sum pyproject.toml | cut -c1-16) $extras"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing int8jit[$extras] into $venv" >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
    # The peer (oneDNN) is optional: where its wheel cannot be installed, its tests skip.
    if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[$extras]" >&2; then
        echo "setup: could not install the oneDNN peer; continuing without it" >&2
        "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[test]" >&2
    fi
    echo "$want" > "$stamp"
fi

export PATH="$venv/bin:$PATH"
case "$job" in
    demo)  exec "$venv/bin/int8jit-demo" "$@" ;;
    test)  exec "$venv/bin/python" -m pytest -q "$@" ;;
    bench) exec "$venv/bin/int8jit-bench" "$@" ;;
    env)   echo "$venv/bin/python" ;;
    *)     echo "usage: bash tools/setup.sh {demo|test|bench|env} [args...]" >&2; exit 2 ;;
esac
