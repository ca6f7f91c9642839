#!/usr/bin/env bash
# Set up (scripts/setup.sh), then lint, run the test suite with coverage, build the docs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The PDF loader example shells out to pdftotext (Debian's poppler-utils); its tests
# skip without it. As root on a Debian-like machine (CI), install it.
if ! command -v pdftotext >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq poppler-utils) >/dev/null 2>&1 ||
        echo "note: could not install poppler-utils; the PDF loader tests will skip" >&2
fi
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ruff check haiku_rag tests bench examples docs/hooks.py
ruff format --check haiku_rag tests bench examples docs/hooks.py
pytest --cov --cov-report=term --cov-fail-under=90 "$@"
mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
