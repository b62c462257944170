# Generated from notebooks/12_speculative_decoding.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


# notebooks/12_speculative_decoding.ipynb, cell 8
class NgramProposer:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's last n tokens."""

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.k, self.min_n, self.max_n = num_speculative_tokens, prompt_lookup_min, prompt_lookup_max

    def propose_one(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k tokens for one sequence; [] when no suffix of length min_n..max_n occurred before."""
        tokens = np.asarray(token_ids)
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            windows = sliding_window_view(tokens[:-1], n)          # (len - n, n): every earlier n-gram
            hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
            if len(hits):
                start = hits[-1] + n                               # just after the latest match
                return tokens[start:start + k].tolist()
        return []

    def propose(self, seqs: list, ks: list[int]) -> dict[str, list[int]]:
        """request id -> its drafts, at most ks[i] for seqs[i]."""
        return {seq.request_id: self.propose_one(seq.token_ids, k) for seq, k in zip(seqs, ks) if k > 0}
