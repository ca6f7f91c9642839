#!/usr/bin/env bash
# Set up (scripts/setup.sh), then lint, run the test suite with coverage, build the docs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ruff check haiku_rag tests bench
ruff format --check haiku_rag tests bench
pytest --cov --cov-report=term --cov-fail-under=90 "$@"
mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
