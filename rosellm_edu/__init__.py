"""LLM inference from scratch: the companion package of the book."""
