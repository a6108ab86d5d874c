"""The inference engine: vLLM AsyncLLM behind a token-in/token-out API, hosted in Ray actors.

Importing this package stays cheap; vLLM is imported when an engine starts.
"""

from roll_async.engine.vllm_engine import PAUSE_MODES, VLLMEngine
from roll_async.errors import EngineStartupError

__all__ = ["PAUSE_MODES", "EngineStartupError", "VLLMEngine"]
