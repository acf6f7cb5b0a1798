#!/usr/bin/env bash
# The adoption environment (issue 44): the published vllm-omni 0.30.0 on the
# vLLM it is built for (0.30.0), in a fresh Python 3.11 venv, for the
# contract's tests against vllm-omni's own app (tests/adoption, .ci/vllm-omni-030).
#
#     requirements/vllm-omni-030.sh          # build (or reuse) the venv
#
# The venv lives at $VLLM_OMNI_030_VENV (default .venv-vllm-omni-030). A venv
# built by the same script (its stamp holds the script's sha256) is reused;
# anything else is rebuilt from scratch. About 3.5 minutes and 6.6 GB.
#
# `pip install vllm==0.30.0` then `pip install vllm-omni==0.30.0` resolve
# with no conflict. This project is NOT installed into it: both are the
# import package `vllm_omni`; the venv's `vllm_omni` is vllm-omni's wheel,
# and the tests put a checkout (pristine or patched) in front of it on
# PYTHONPATH (tools/adoption.py).
#
# Facts of a CPU-only machine, handled at import time by tests/adoption
# (tests/adoption/cpu.py), not here:
# - the index's torchvision and torchaudio are CUDA builds: torchvision's
#   compiled ops need libtorch_cuda.so (its two op schemas torchvision::nms
#   and torchvision::qnms are defined with torch.library before it is
#   imported); torchaudio falls back to pure Python when its lib/*.so are
#   absent, so they are removed here;
# - vLLM's platform is set to its CPU platform before vLLM's engine modules
#   are imported.
set -euo pipefail
cd "$(dirname "$0")/.."

python="$(command -v python3.11 || command -v python3)"
venv="${VLLM_OMNI_030_VENV:-.venv-vllm-omni-030}"
stamp="$(sha256sum requirements/vllm-omni-030.sh requirements/lock.txt | sha256sum | cut -d' ' -f1)"
if [ -f "$venv/.vllm-omni-030-stamp" ] && [ "$(cat "$venv/.vllm-omni-030-stamp")" = "$stamp" ]; then
  echo "reusing $venv (built by this script)"
  exit 0
fi
rm -rf "$venv"
"$python" -m venv "$venv"
export PIP_NO_COMPILE=1
"$venv/bin/pip" install -q "vllm==0.30.0"
"$venv/bin/pip" install -q "vllm-omni==0.30.0"
# What the errors package needs beyond vllm-omni's own requirements (the
# series adds it: detect-secrets, the sanitizer's credential shapes, pinned
# as requirements/lock.txt pins it), and the test client side (the openai
# SDK, httpx, prometheus_client and uvicorn come with vLLM).
"$venv/bin/pip" install -q "$(grep '^detect-secrets==' requirements/lock.txt)" pytest pytest-asyncio
# torchaudio's compiled extensions need CUDA's libraries; without them it
# imports its pure-Python paths.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -f "$site"/torchaudio/lib/*.so
"$venv/bin/pip" freeze > "$venv/freeze.txt"
echo "$stamp" > "$venv/.vllm-omni-030-stamp"
echo "built $venv: vllm==0.30.0, vllm-omni==0.30.0"
