#!/usr/bin/env bash
# Create .venv (once) and install haiku.rag with the offline embedder and dev tools.
# torch==2.13.0 first: it is the CPU build; a bare `torch` requirement pulls CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
. .venv/bin/activate
if [ ! -f .venv/.haiku-installed ] || [ pyproject.toml -nt .venv/.haiku-installed ]; then
    python -m pip install --quiet --upgrade pip
    python -m pip install --quiet torch==2.13.0
    python -m pip install --quiet -e '.[local,dev,mcp]'
    touch .venv/.haiku-installed
fi
