"""Tests of ``vllm-omni errors audit`` (DESIGN §8)."""
