"""The inference engine: vLLM AsyncLLM behind a token-in/token-out API, hosted in Ray actors, with the router and weight transport around it; importing it stays cheap, as vLLM is imported only when an engine starts."""

from roll_async.engine.vllm_engine import PAUSE_MODES, VLLMEngine
from roll_async.errors import EngineStartupError

__all__ = ["PAUSE_MODES", "EngineStartupError", "VLLMEngine"]
