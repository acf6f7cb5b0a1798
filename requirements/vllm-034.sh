#!/usr/bin/env bash
# The third pinned environment: vllm==0.34.0 over this project's lock, for
# the error, engine and observability suites on the newer supported vLLM
# (pyproject.toml accepts vllm>=0.33,<0.35; the lock keeps 0.33.0, the one
# that installs from the index).
#
#     requirements/vllm-034.sh            # build (or reuse) the venv
#
# The venv lives at $VLLM_OMNI_VLLM034_VENV (default .venv-vllm-034). A venv
# built from the same lock and script (its stamp holds their sha256) is
# reused; anything else is rebuilt from scratch.
#
# Why not `pip install vllm==0.34.0`: it pins flashinfer-python==0.7.3, a GPU
# kernel package the index does not serve (it has 0.7.2.post1 and 0.7.4), so
# the resolve fails. Every other requirement of 0.34.0 is met by the lock
# (torch==2.14.0, huggingface_hub>=2.0, filelock>=4.2.4, ...), so the lock
# goes in with --no-deps, minus its vllm line, then vllm==0.34.0 with
# --no-deps. flashinfer stays at the lock's 0.7.2.post1: nothing on a CPU
# imports it.
set -euo pipefail
cd "$(dirname "$0")/.."

lock=requirements/lock.txt
vllm="vllm==0.34.0"
python="$(command -v python3.11 || command -v python3)"
venv="${VLLM_OMNI_VLLM034_VENV:-.venv-vllm-034}"
stamp="$(sha256sum "$lock" pyproject.toml requirements/vllm-034.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$venv/.vllm-034-stamp" ] && [ "$(cat "$venv/.vllm-034-stamp")" = "$stamp" ]; then
  echo "reusing $venv (built from this lock)"
  exit 0
fi
rm -rf "$venv"
"$python" -m venv "$venv"
grep -v '^vllm==' "$lock" > "$venv/lock-without-vllm.txt"
"$venv/bin/pip" install --no-deps -r "$venv/lock-without-vllm.txt"
"$venv/bin/pip" install --no-deps "$vllm"
"$venv/bin/pip" install --no-deps -e .
echo "$stamp" > "$venv/.vllm-034-stamp"
echo "built $venv from $lock with $vllm"
