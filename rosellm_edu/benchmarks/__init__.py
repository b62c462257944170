"""Benchmarks: the engine against transformers and other servers, the decode step, the sampler."""
