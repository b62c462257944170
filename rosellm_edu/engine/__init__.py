"""The engines, one per chapter. `LLMEngine` is the newest one: the engine `LLM` runs by default."""

from rosellm_edu.engine.cached import CachedEngine
from rosellm_edu.engine.continuous import ContinuousBatchingEngine
from rosellm_edu.engine.llm_engine import LLMEngine
from rosellm_edu.engine.naive import NaiveEngine
from rosellm_edu.engine.paged_engine import PagedEngine

__all__ = ["NaiveEngine", "CachedEngine", "ContinuousBatchingEngine", "PagedEngine", "LLMEngine"]
