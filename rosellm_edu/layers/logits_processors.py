# Generated from notebooks/01a_logits_processors.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from dataclasses import dataclass

import torch

from rosellm_edu.sampling_params import SamplingParams


# notebooks/01a_logits_processors.ipynb, cell 4
def on_device(values: list | torch.Tensor, dtype: torch.dtype | None, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on `device`. To a GPU it goes from pinned memory with non_blocking=True, so the
    host does not wait for the GPU to finish the work already queued (a plain copy would)."""
    tensor = torch.as_tensor(values, dtype=dtype)     # a CPU tensor too
    return tensor.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else tensor.to(device)


# notebooks/01a_logits_processors.ipynb, cell 4
def token_counts(ids: list[list[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """(n, vocab_size): how often each token occurs in each of the n lists. The lists are padded to one length
    with the id vocab_size, a column that is dropped after one scatter_add."""
    width = max(map(len, ids), default=0)
    padded = on_device([row + [vocab_size] * (width - len(row)) for row in ids], torch.long, device)
    padded = padded.reshape(len(ids), width)                                      # (n, width)
    counts = torch.zeros(len(ids), vocab_size + 1, device=device)                 # (n, vocab_size + 1)
    counts.scatter_add_(1, padded, torch.ones(padded.shape, device=device))
    return counts[:, :vocab_size]


# notebooks/01a_logits_processors.ipynb, cell 5
def apply_repetition_penalty(logits: torch.Tensor, params: list[SamplingParams], prompt_ids: list[list[int]],
                             output_ids: list[list[int]]) -> None:
    """In place on logits (B, V): every token of a row's prompt or output has its logit divided by the row's
    repetition_penalty where positive, multiplied where negative. Rows with penalty 1 are not touched."""
    rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1]
    if rows:
        seen = token_counts([prompt_ids[i] + output_ids[i] for i in rows], logits.shape[1], logits.device) > 0
        penalize_repetition(logits, rows, params, seen)


# notebooks/01a_logits_processors.ipynb, cell 5
def penalize_repetition(logits: torch.Tensor, rows: list[int], params: list[SamplingParams],
                        seen: torch.Tensor) -> None:
    """The penalty on logits[rows] (n, V) where seen (n, V) is True."""
    penalty = on_device([params[i].repetition_penalty for i in rows], torch.float32, logits.device)[:, None]
    index = on_device(rows, torch.long, logits.device)                                 # (n,)
    x = logits[index]                                                                   # (n, V)
    logits[index] = torch.where(seen, torch.where(x > 0, x / penalty, x * penalty), x)


# notebooks/01a_logits_processors.ipynb, cell 8
def apply_frequency_presence_penalties(logits: torch.Tensor, params: list[SamplingParams],
                                       output_ids: list[list[int]]) -> None:
    """In place on logits (B, V), OpenAI's formula on each row's output tokens:
    logit - frequency_penalty * count - presence_penalty * (count > 0). Rows with both at 0 are not touched."""
    rows = [i for i, p in enumerate(params) if p.frequency_penalty != 0 or p.presence_penalty != 0]
    if rows:
        penalize_frequency_presence(logits, rows, params,
                                    token_counts([output_ids[i] for i in rows], logits.shape[1], logits.device))


# notebooks/01a_logits_processors.ipynb, cell 8
def penalize_frequency_presence(logits: torch.Tensor, rows: list[int], params: list[SamplingParams],
                                counts: torch.Tensor) -> None:
    """The formula on logits[rows] (n, V), counts (n, V) being how often each row generated each token."""
    frequency = on_device([params[i].frequency_penalty for i in rows], torch.float32, logits.device)[:, None]
    presence = on_device([params[i].presence_penalty for i in rows], torch.float32, logits.device)[:, None]
    logits[on_device(rows, torch.long, logits.device)] -= frequency * counts + presence * (counts > 0)


# notebooks/01a_logits_processors.ipynb, cell 11
def apply_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> None:
    """In place on logits (B, V): add each row's logit_bias to the logits of its tokens."""
    pairs = [(i, token, bias) for i, p in enumerate(params) for token, bias in (p.logit_bias or {}).items()]
    if not pairs:
        return
    rows, tokens, bias = zip(*pairs)
    rows, tokens = on_device(rows, torch.long, logits.device), on_device(tokens, torch.long, logits.device)
    logits[rows, tokens] += on_device(bias, torch.float32, logits.device)


# notebooks/01a_logits_processors.ipynb, cell 11
def apply_min_tokens(logits: torch.Tensor, params: list[SamplingParams], num_outputs: list[int],
                     eos_token_ids: set[int]) -> None:
    """In place on logits (B, V): while a row has fewer than min_tokens outputs (num_outputs), its
    stop_token_ids, and the EOS ids unless it ignores EOS, get -inf."""
    pairs = []
    for i, (p, n) in enumerate(zip(params, num_outputs)):
        if n < p.min_tokens:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            pairs += [(i, token) for token in sorted(stops)]
    if pairs:
        rows, tokens = zip(*pairs)
        at = (on_device(rows, torch.long, logits.device), on_device(tokens, torch.long, logits.device))
        logits.index_put_(at, logits.new_full((), -torch.inf))   # a device scalar: a Python one is copied over


# notebooks/01a_logits_processors.ipynb, cell 14
def apply_logits_processors(logits: torch.Tensor, params: list[SamplingParams], prompt_ids: list[list[int]],
                            output_ids: list[list[int]], eos_token_ids: set[int]) -> torch.Tensor:
    """Each row's min_tokens, logit_bias, repetition, frequency and presence penalties on logits (B, V), in
    vLLM's order, as a new float32 tensor; the caller's logits stay as they were. A batch in which no row uses
    any of them gets its logits back as they are: nothing is built or copied."""
    if not any(uses_logits_processors(p, len(out)) for p, out in zip(params, output_ids)):
        return logits
    logits = logits.to(torch.float32, copy=True)                                       # (B, V)
    apply_min_tokens(logits, params, [len(out) for out in output_ids], eos_token_ids)
    apply_logit_bias(logits, params)
    apply_repetition_penalty(logits, params, prompt_ids, output_ids)
    apply_frequency_presence_penalties(logits, params, output_ids)
    return logits


# notebooks/01a_logits_processors.ipynb, cell 14
def uses_logits_processors(params: SamplingParams, num_output_tokens: int) -> bool:
    """Does a row with these params and this many output tokens change anything here?"""
    return (params.repetition_penalty != 1 or params.frequency_penalty != 0 or params.presence_penalty != 0
            or bool(params.logit_bias) or num_output_tokens < params.min_tokens)


# notebooks/01a_logits_processors.ipynb, cell 24
@dataclass
class ProcessorState:
    """What one sequence's logits processors need, as tensors on the engine's device: built once from its params
    and prompt, the output counts brought up to date at each use with the tokens appended since (one, or a few
    after speculative decoding). None stands for a request with no penalty and no logit_bias."""
    bias_ids: torch.Tensor | None        # (k,) logit_bias's token ids
    bias_values: torch.Tensor | None     # (k,) their biases, float32
    prompt_mask: torch.Tensor | None     # (V,) bool: in the prompt; the repetition penalty's
    output_counts: torch.Tensor | None   # (V,) float32: each token's count in the first `counted` outputs
    counted: int = 0

    @classmethod
    def build(cls, params: SamplingParams, prompt_ids: list[int], vocab_size: int,
              device: torch.device) -> "ProcessorState | None":
        penalized = params.repetition_penalty != 1 or params.frequency_penalty != 0 or params.presence_penalty != 0
        if not penalized and not params.logit_bias:
            return None                       # min_tokens needs only the output's length
        bias = params.logit_bias or {}
        ids, values = (on_device(list(bias), torch.long, device), on_device(list(bias.values()), torch.float32,
                                                                            device)) if bias else (None, None)
        mask = None
        if params.repetition_penalty != 1:
            mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            mask[on_device(prompt_ids, torch.long, device)] = True
        return cls(ids, values, mask, torch.zeros(vocab_size, device=device) if penalized else None)

    def count(self, output_ids: list[int]) -> None:
        """Count the outputs appended since the last call (they are never taken back)."""
        if self.output_counts is not None:
            for token in output_ids[self.counted:]:
                self.output_counts[token] += 1
        self.counted = len(output_ids)


# notebooks/01a_logits_processors.ipynb, cell 25
def apply_kept_processors(logits: torch.Tensor, params: list[SamplingParams], states: list[ProcessorState | None],
                          output_ids: list[list[int]], eos_token_ids: set[int],
                          drafted: list[list[int]] | None = None) -> torch.Tensor:
    """apply_logits_processors from each row's kept ProcessorState. A row's output is output_ids[i] then
    drafted[i] (in speculative decoding, the drafts before that row): the state counts the first, one scatter
    adds the second. The work of a step grows with its rows and drafts, not with the context or logit_bias."""
    drafted = drafted or [[]] * len(params)
    lengths = [len(out) + len(d) for out, d in zip(output_ids, drafted)]
    if not any(s is not None or n < p.min_tokens for p, s, n in zip(params, states, lengths)):
        return logits
    logits = logits.to(torch.float32, copy=True)                                       # (B, V)
    apply_min_tokens(logits, params, lengths, eos_token_ids)
    biased = [i for i, s in enumerate(states) if s is not None and s.bias_ids is not None]
    if biased:                                                                  # one scatter for every row's bias
        sizes = [len(states[i].bias_ids) for i in biased]
        rows = on_device(biased, torch.long, logits.device).repeat_interleave(
            on_device(sizes, torch.long, logits.device), output_size=sum(sizes))     # (entries,)
        ids, bias = torch.cat([states[i].bias_ids for i in biased]), torch.cat([states[i].bias_values for i in biased])
        logits.index_put_((rows, ids), bias, accumulate=True)
    rows = [i for i, s in enumerate(states) if s is not None and s.output_counts is not None]
    if not rows:
        return logits
    for i in rows:
        states[i].count(output_ids[i])
    counts = torch.stack([states[i].output_counts for i in rows])                   # (n, V)
    pairs = [(k, t) for k, i in enumerate(rows) for t in drafted[i]]
    if pairs:                                                                   # one scatter for every row's drafts
        at, tokens = zip(*pairs)
        at, tokens = on_device(at, torch.long, logits.device), on_device(tokens, torch.long, logits.device)
        counts.index_put_((at, tokens), torch.ones(len(pairs), device=logits.device), accumulate=True)
    pick = lambda ks: counts.index_select(0, on_device(ks, torch.long, logits.device))  # noqa: E731 (no host sync)
    repeat = [k for k, i in enumerate(rows) if params[i].repetition_penalty != 1]
    if repeat:
        seen = torch.stack([states[rows[k]].prompt_mask for k in repeat]) | (pick(repeat) > 0)   # (r, V)
        penalize_repetition(logits, [rows[k] for k in repeat], params, seen)
    subtract = [k for k, i in enumerate(rows) if params[i].frequency_penalty != 0 or params[i].presence_penalty != 0]
    if subtract:
        penalize_frequency_presence(logits, [rows[k] for k in subtract], params, pick(subtract))
    return logits
