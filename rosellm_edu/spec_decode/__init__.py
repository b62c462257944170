"""Speculative decoding: proposers guess a sequence's next tokens (`ngram_proposer`, `draft_model_proposer`), the
engine verifies them in one forward pass (`rejection_sampler`), `config` checks vLLM's `speculative_config` and
`metrics` counts what was accepted."""
