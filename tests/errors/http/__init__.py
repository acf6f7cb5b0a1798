"""Tests of ``vllm_omni.errors.http``, one module per job of the package."""
