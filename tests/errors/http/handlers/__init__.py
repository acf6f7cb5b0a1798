"""Tests of ``vllm_omni.errors.http.handlers``."""
