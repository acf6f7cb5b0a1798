"""Built-in pipeline definitions (YAML package data), read by ``vllm_omni.config``."""
