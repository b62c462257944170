# Generated from notebooks/12_speculative_decoding.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from dataclasses import dataclass


# notebooks/12_speculative_decoding.ipynb, cell 34
@dataclass
class SpecDecodingStats:
    num_spec_steps: int = 0         # (sequence, step) pairs that verified at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def observe(self, num_drafts: int, num_accepted: int) -> None:
        if num_drafts:
            self.num_spec_steps += 1
            self.num_draft_tokens += num_drafts
            self.num_accepted_tokens += num_accepted

    def as_dict(self) -> dict:
        steps, drafts = self.num_spec_steps, self.num_draft_tokens
        return {"num_spec_steps": steps, "num_draft_tokens": drafts, "num_accepted_tokens": self.num_accepted_tokens,
                "acceptance_rate": self.num_accepted_tokens / drafts if drafts else 0.0,
                "mean_accepted_length": 1 + self.num_accepted_tokens / steps if steps else 1.0}
