"""LLM inference from scratch: the companion package of the book. The entry points mirror vLLM's."""

import importlib

# Imported on first use, so `python -m rosellm_edu.book.export` runs even before the generated modules exist.
_EXPORTS = {
    "LLM": "rosellm_edu.llm",
    "LLMEngine": "rosellm_edu.engine.llm_engine",
    "AsyncLLMEngine": "rosellm_edu.engine.async_llm_engine",
    "SamplingParams": "rosellm_edu.sampling_params",
    "RequestOutput": "rosellm_edu.outputs",
    "CompletionOutput": "rosellm_edu.outputs",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rosellm_edu' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
