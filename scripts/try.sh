#!/usr/bin/env bash
# The main job: build a knowledge base from a folder and search it, offline.
#   bash scripts/try.sh [FOLDER] [QUERY]     (defaults: ./docs "how does hybrid search fuse signals")
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
folder="${1:-docs}"
query="${2:-how does hybrid search fuse signals}"
db="${HAIKU_RAG_DB:-.haiku/try.lancedb}"
haiku-rag --db "$db" add "$folder"
haiku-rag --db "$db" search "$query"
