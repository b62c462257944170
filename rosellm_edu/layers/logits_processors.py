# Generated from notebooks/01a_logits_processors.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import torch

from rosellm_edu.sampling_params import SamplingParams


# notebooks/01a_logits_processors.ipynb, cell 4
def on_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on `device`. To a GPU it goes from pinned memory with non_blocking=True, so the
    host does not wait for the GPU to finish the work already queued (a plain copy would)."""
    tensor = torch.tensor(values, dtype=dtype)
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
    if not rows:
        return
    seen = token_counts([prompt_ids[i] + output_ids[i] for i in rows], logits.shape[1], logits.device) > 0
    penalty = on_device([params[i].repetition_penalty for i in rows], torch.float32, logits.device)[:, None]
    rows = on_device(rows, torch.long, logits.device)                                  # (n,)
    x = logits[rows]                                                                    # (n, V)
    logits[rows] = torch.where(seen, torch.where(x > 0, x / penalty, x * penalty), x)


# notebooks/01a_logits_processors.ipynb, cell 8
def apply_frequency_presence_penalties(logits: torch.Tensor, params: list[SamplingParams],
                                       output_ids: list[list[int]]) -> None:
    """In place on logits (B, V), OpenAI's formula on each row's output tokens:
    logit - frequency_penalty * count - presence_penalty * (count > 0). Rows with both at 0 are not touched."""
    rows = [i for i, p in enumerate(params) if p.frequency_penalty != 0 or p.presence_penalty != 0]
    if not rows:
        return
    counts = token_counts([output_ids[i] for i in rows], logits.shape[1], logits.device)   # (n, V)
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
def apply_min_tokens(logits: torch.Tensor, params: list[SamplingParams], output_ids: list[list[int]],
                     eos_token_ids: set[int]) -> None:
    """In place on logits (B, V): while a row has fewer than min_tokens outputs, its stop_token_ids, and the EOS
    ids unless it ignores EOS, get -inf."""
    pairs = []
    for i, (p, out) in enumerate(zip(params, output_ids)):
        if len(out) < p.min_tokens:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            pairs += [(i, token) for token in sorted(stops)]
    if pairs:
        rows, tokens = zip(*pairs)
        logits[on_device(rows, torch.long, logits.device), on_device(tokens, torch.long, logits.device)] = -torch.inf


# notebooks/01a_logits_processors.ipynb, cell 14
def apply_logits_processors(logits: torch.Tensor, params: list[SamplingParams], prompt_ids: list[list[int]],
                            output_ids: list[list[int]], eos_token_ids: set[int]) -> torch.Tensor:
    """Each row's min_tokens, logit_bias, repetition, frequency and presence penalties on logits (B, V), in
    vLLM's order, as a new float32 tensor; the caller's logits stay as they were. A batch in which no row uses
    any of them gets its logits back as they are: nothing is built or copied."""
    if not any(uses_logits_processors(p, len(out)) for p, out in zip(params, output_ids)):
        return logits
    logits = logits.to(torch.float32, copy=True)                                       # (B, V)
    apply_min_tokens(logits, params, output_ids, eos_token_ids)
    apply_logit_bias(logits, params)
    apply_repetition_penalty(logits, params, prompt_ids, output_ids)
    apply_frequency_presence_penalties(logits, params, output_ids)
    return logits


# notebooks/01a_logits_processors.ipynb, cell 14
def uses_logits_processors(params: SamplingParams, num_output_tokens: int) -> bool:
    """Does a row with these params and this many output tokens change anything here?"""
    return (params.repetition_penalty != 1 or params.frequency_penalty != 0 or params.presence_penalty != 0
            or bool(params.logit_bias) or num_output_tokens < params.min_tokens)
