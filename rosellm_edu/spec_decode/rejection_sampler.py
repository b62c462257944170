# Generated from notebooks/12_speculative_decoding.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import torch


# notebooks/12_speculative_decoding.ipynb, cell 15
def rejection_sample(target_probs: torch.Tensor, draft_ids: list[int], draft_probs: torch.Tensor | None,
                     generator: torch.Generator | None = None) -> list[int]:
    """Leviathan et al.'s rule for one sequence. target_probs (k + 1, V): p at each draft's position and after the
    last; draft_probs (k, V): q at each position, None for point masses (a proposer that always guesses the same).
    Returns the accepted drafts, then one recovered (on a rejection) or bonus token."""
    k, vocab_size = len(draft_ids), target_probs.shape[1]
    ids = torch.tensor(draft_ids, dtype=torch.long)
    q = draft_probs if draft_probs is not None else torch.nn.functional.one_hot(ids, vocab_size).to(target_probs)
    p_x, q_x = target_probs[torch.arange(k), ids], q[torch.arange(k), ids]      # (k,)
    uniform = torch.rand(k, generator=generator)
    rejected = (uniform >= (p_x / q_x).clamp(max=1)).nonzero()
    a = int(rejected[0]) if len(rejected) else k                                 # drafts accepted
    if a == k:
        last = target_probs[k]                                                   # the bonus token
    else:
        last = (target_probs[a] - q[a]).clamp_min(0)                             # the leftover mass
    return draft_ids[:a] + [int(torch.multinomial(last / last.sum(), 1, generator=generator))]


# notebooks/12_speculative_decoding.ipynb, cell 15
def accepted_count(sampled: list[int], draft_ids: list[int]) -> int:
    """The point-mass case as the engine runs it: sampled[i] is the target's own draw at draft i's position;
    accept while the two agree. Accepting x with probability p(x) and otherwise drawing from p without x is the
    same law as drawing y ~ p and accepting x iff y == x, keeping y when it differs."""
    a = 0
    while a < len(draft_ids) and sampled[a] == draft_ids[a]:
        a += 1
    return a
