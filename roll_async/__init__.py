"""roll-async: an asynchronous per-environment rollout engine for multi-turn LLM agent RL."""

__version__ = "0.1.0"
