"""Tests of ``vllm_omni.errors``."""
