# Generated from notebooks/01_token_generation.ipynb, notebooks/06_fast_sampling.ipynb, notebooks/06a_logprobs.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from dataclasses import dataclass

import torch

from rosellm_edu.layers.logits_processors import on_device
from rosellm_edu.outputs import Logprob
from rosellm_edu.sampling_params import SamplingParams


# notebooks/01_token_generation.ipynb, cell 4
def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits / temperature


# notebooks/01_token_generation.ipynb, cell 4
def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop the tokens less likely than min_p times the most likely one; min_p 0 keeps everything."""
    if min_p <= 0:
        return logits
    probs = logits.softmax(dim=-1)
    too_unlikely = probs < min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(too_unlikely, float("-inf"))


# notebooks/01_token_generation.ipynb, cell 4
def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the top_k largest logits of the last dimension; top_k <= 0 or >= vocab keeps everything."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth_largest = logits.topk(top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


# notebooks/01_token_generation.ipynb, cell 4
def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the most likely tokens until their mass reaches top_p, including the token that crosses it."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    remove_sorted = mass_before >= top_p                  # the first token always stays
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


# notebooks/01_token_generation.ipynb, cell 11
def filtered_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, min-p, top-k, then top-p (on the renormalised top-k distribution). Greedy keeps the argmax."""
    if params.greedy:
        return torch.full_like(logits, float("-inf"), dtype=torch.float32).scatter(-1, logits.argmax(-1, keepdim=True), 0.0)
    logits = apply_min_p(apply_temperature(logits.float(), params.temperature), params.min_p)
    return apply_top_p(apply_top_k(logits, params.top_k), params.top_p)


# notebooks/06_fast_sampling.ipynb, cell 55
SAMPLING_MASK_CAP = 2048   # the most vocabulary ids one sampling mask lists


# notebooks/06a_logprobs.ipynb, cell 4
def logprob_table(raw_logits: torch.Tensor, token_ids: torch.Tensor, num_top: int) -> torch.Tensor:
    """Per row of the model's raw logits (n, V): the log-probability of token_ids[row] and its rank (the number
    of tokens at least as likely, as vLLM counts: 1 = the most likely), then the ids and log-probabilities of the
    num_top most likely tokens. (n, 2 + 2 * num_top) float64, left on the device."""
    logprobs = raw_logits.float().log_softmax(dim=-1)                    # (n, V) the model's own distribution
    chosen = logprobs.gather(-1, token_ids[:, None])                     # (n, 1)
    rank = (logprobs >= chosen).sum(dim=-1, keepdim=True)               # (n, 1)
    top, top_ids = logprobs.topk(num_top, dim=-1)                       # (n, num_top), most likely first
    return torch.cat([chosen.double(), rank.double(), top_ids.double(), top.double()], dim=-1)


# notebooks/06a_logprobs.ipynb, cell 4
def logprob_dict(row: list[float], token: int, num_top: int) -> dict[int, Logprob]:
    """One row of logprob_table, on the host, as {token id: Logprob}: the token, then its num_top best."""
    width = (len(row) - 2) // 2                                          # the table's num_top
    entries = {token: Logprob(row[0], int(row[1]))}
    for r in range(num_top):
        entries[int(row[2 + r])] = Logprob(row[2 + width + r], r + 1)
    return entries


# notebooks/06a_logprobs.ipynb, cell 6
def sampled_logprob_table(raw_logits: torch.Tensor, params: list[SamplingParams],
                          tokens: torch.Tensor) -> torch.Tensor | None:
    """logprob_table of the rows whose params ask for logprobs, None if none does. A token of -1 (top-p's
    rare redraw, still to come) reads as 0 here; the caller computes those rows again."""
    asking = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not asking:
        return None
    num_top = max(params[i].logprobs for i in asking)
    return logprob_table(rows(raw_logits, asking), tokens[asking].clamp_min(0), num_top)


# notebooks/06a_logprobs.ipynb, cell 6
def to_host(tokens: torch.Tensor, table: torch.Tensor | None) -> tuple[list[int], list[list[float]]]:
    """The step's one device->host transfer: the token ids, and the logprob table when there is one."""
    if table is None:
        return tokens.tolist(), []
    n, width = len(tokens), table.shape[1]
    flat = torch.cat([tokens.double(), table.flatten()]).tolist()     # one tensor, one transfer
    return [int(t) for t in flat[:n]], [flat[n + r * width:n + (r + 1) * width] for r in range(table.shape[0])]


# notebooks/06a_logprobs.ipynb, cell 6
def logprob_dicts(params: list[SamplingParams], token_ids: list[int],
                  table: list[list[float]]) -> list[dict[int, Logprob] | None]:
    """Each row's {token id: Logprob}, None where it did not ask."""
    asking = [i for i, p in enumerate(params) if p.logprobs is not None]
    out = [None] * len(params)
    for i, row in zip(asking, table):
        out[i] = logprob_dict(row, token_ids[i], params[i].logprobs)
    return out


# notebooks/06a_logprobs.ipynb, cell 8
@dataclass
class SamplerOutput:
    token_ids: list[int]
    sampling_masks: list[list[int] | None]  # sorted kept ids per row; None where not asked or nothing truncated
    sampling_logz: list[float | None]       # log of the kept softmax mass per row; None where not asked
    logprobs: list[dict[int, Logprob] | None] | None = None  # per row {id: Logprob}; None where not asked


# notebooks/06_fast_sampling.ipynb, cell 13
TOP_P_CANDIDATES = 1024    # top-p or min-p without top-k first looks at this many tokens, then at all of them


# notebooks/06_fast_sampling.ipynb, cell 13
def effective_top_k(params: SamplingParams, vocab_size: int) -> int:
    """top_k clamped to the vocabulary: off (<= 0) or too large means all `vocab_size` tokens."""
    return params.top_k if 0 < params.top_k < vocab_size else vocab_size


# notebooks/06_fast_sampling.ipynb, cell 13
def candidate_width(params: SamplingParams, vocab_size: int, whole: bool = False) -> int:
    """How many of its most likely tokens a row looks at: its top k; without top-k (top-p or min-p alone)
    TOP_P_CANDIDATES, or the whole vocabulary when those fell short."""
    top_k = effective_top_k(params, vocab_size)
    return top_k if top_k < vocab_size or whole else min(vocab_size, TOP_P_CANDIDATES)


# notebooks/06_fast_sampling.ipynb, cell 13
def truncates(params: SamplingParams, vocab_size: int) -> bool:
    """Does a request draw from less than the whole vocabulary?"""
    return (params.greedy or effective_top_k(params, vocab_size) < vocab_size or params.top_p < 1
            or params.min_p > 0)


# notebooks/06_fast_sampling.ipynb, cell 16
def rows(logits: torch.Tensor, indices: list[int]) -> torch.Tensor:
    """logits[indices], without a copy when that is every row, and without a host sync on a GPU."""
    if len(indices) == logits.shape[0]:
        return logits
    return logits.index_select(0, on_device(indices, torch.long, logits.device))


# notebooks/06_fast_sampling.ipynb, cell 16
def put_rows(out: torch.Tensor, indices: list[int], values: torch.Tensor) -> None:
    """out[indices] = values, without a host sync on a GPU."""
    out.index_copy_(0, on_device(indices, torch.long, out.device), values)


# notebooks/06_fast_sampling.ipynb, cell 16
@dataclass
class Candidates:
    """Each row's most likely tokens, sorted, and the distribution that survives top-k then top-p on them."""
    ids: torch.Tensor       # (n, K) vocabulary ids, most likely first
    logits: torch.Tensor    # (n, K) their logits after temperature
    kept: torch.Tensor      # (n, K) bool, a prefix of each row: the support a token is drawn from
    probs: torch.Tensor     # (n, K) the filtered distribution, renormalised; 0 where not kept
    complete: torch.Tensor  # (n,) bool: top-p was decided within the K candidates (always, when top-k is on)


# notebooks/06_fast_sampling.ipynb, cell 17
def top_k_top_p_candidates(logits: torch.Tensor, temperature: list[float], top_k: list[int], top_p: list[float],
                           widths: list[int], min_p: list[float] | None = None) -> Candidates:
    """Chapter 01's filter (temperature, min-p, top-k, renormalise, top-p keeping the token that crosses p) on
    each row's `widths[row]` most likely tokens of logits (n, V), instead of on a sort of the whole vocabulary.
    Per row: top_k clamped to [1, V] (V = off), widths[row] == top_k[row] where top-k is on; top_p 1, min_p 0 = off."""
    vocab_size, device = logits.shape[1], logits.device
    width = on_device(widths, torch.long, device)[:, None]             # (n, 1)
    p = on_device(top_p, torch.float32, device)[:, None]                # (n, 1)
    p_off = on_device([x >= 1 for x in top_p], torch.bool, device)[:, None]  # decided exactly: 1 - 1e-16 is on
    t = on_device(temperature, torch.float32, device)[:, None]          # (n, 1)
    log_min_p = on_device(min_p or [0.0] * len(widths), torch.float32, device).log()[:, None]  # (n, 1), -inf: off
    top, ids = logits.topk(max(widths), dim=-1)                        # (n, K), sorted descending
    scaled = top.float() / t                                           # temperature keeps the order: scale K, not V
    # min-p keeps p >= min_p * p_max, that is logit >= the top logit + log(min_p): a prefix of the candidates
    in_width = (torch.arange(scaled.shape[1], device=device) < width) & (scaled >= scaled[:, :1] + log_min_p)
    # top-k renormalises over the top k (of what min-p kept) ...
    probs = scaled.masked_fill(~in_width, -torch.inf).softmax(dim=-1)  # (n, K)
    off = [i for i, k in enumerate(top_k) if k == vocab_size]
    if off:  # ... but top-p alone reads the whole vocabulary's distribution (after min-p)
        whole = rows(logits, off).float() / rows(t, off)               # (n_off, V)
        whole = whole.masked_fill(whole < whole.max(dim=-1, keepdim=True).values + rows(log_min_p, off), -torch.inf)
        put_rows(probs, off, whole.softmax(dim=-1).gather(-1, rows(ids, off)) * rows(in_width, off))
    mass_before = probs.cumsum(dim=-1) - probs
    kept = in_width & ((mass_before < p) | p_off)                      # the token that crosses p stays
    top_k_on = on_device([k < vocab_size for k in top_k], torch.bool, device)
    last = in_width.gather(-1, width - 1)[:, 0]                        # False: min-p ended inside the candidates
    complete = top_k_on | (width[:, 0] == vocab_size) | ~last | ((probs.sum(dim=-1) >= p[:, 0]) & ~p_off[:, 0])
    probs = probs * kept
    return Candidates(ids, scaled, kept, probs / probs.sum(dim=-1, keepdim=True), complete)


# notebooks/06_fast_sampling.ipynb, cell 23
def random_sample(probs: torch.Tensor, widths: list[int], generators: list[torch.Generator | None],
                  generator: torch.Generator | None) -> torch.Tensor:
    """Exponential race: argmax(probs / Exp(1)) is index i with probability probs[i] / sum(probs), without
    torch.multinomial. probs (n, K) -> (n,). A seeded row draws exactly widths[row] numbers from its own
    generator, so its draw does not depend on the rows beside it; the other rows share one call on `generator`."""
    noise = torch.empty_like(probs)
    shared = [i for i, g in enumerate(generators) if g is None]
    if len(shared) == len(generators):
        noise = exponential(probs.shape, generator, probs.device)
    elif shared:
        put_rows(noise, shared, exponential((len(shared), probs.shape[1]), generator, probs.device))
    for i, g in enumerate(generators):
        if g is not None:
            noise[i, :widths[i]] = exponential((widths[i],), g, probs.device)
            noise[i, widths[i]:] = 1.0             # outside the row's own candidates: probability 0 anyway
    noise.clamp_min_(torch.finfo(noise.dtype).tiny)  # Exp(1) can round to 0, and 0 / 0 would win the argmax
    return (probs / noise).argmax(dim=-1)


# notebooks/06_fast_sampling.ipynb, cell 23
def exponential(shape, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Exp(1) numbers from `generator`, drawn where it lives (a CPU generator: then copied to device)."""
    where = generator.device if generator is not None else device
    return torch.empty(shape, device=where).exponential_(generator=generator).to(device)


# notebooks/06_fast_sampling.ipynb, cell 31
def draw_truncated(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
                   generator: torch.Generator | None, whole: bool = False) -> tuple[torch.Tensor, Candidates]:
    """Draw one token per row of logits (n, V) from its top-k/top-p candidates; -1 where top-p alone needs
    more than TOP_P_CANDIDATES tokens (a flat distribution). whole: look at the whole vocabulary instead."""
    vocab_size = logits.shape[1]
    top_k = [effective_top_k(p, vocab_size) for p in params]
    widths = [candidate_width(p, vocab_size, whole) for p in params]
    cand = top_k_top_p_candidates(logits, [p.temperature for p in params], top_k, [p.top_p for p in params], widths,
                                  [p.min_p for p in params])
    choice = random_sample(cand.probs, widths, generators, generator)                  # (n,) positions
    tokens = cand.ids.gather(-1, choice[:, None]).squeeze(-1)                           # (n,) vocabulary ids
    return torch.where(cand.complete, tokens, -1), cand


# notebooks/06_fast_sampling.ipynb, cell 33
def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax, (n, V) -> (n,), taken in float32: the same index as in bfloat16 (ties go to the first).
    Chapter 06 times it against bfloat16's own argmax, on the CPU at hand."""
    return logits.float().argmax(dim=-1)


# notebooks/06_fast_sampling.ipynb, cell 57
def sampling_masks(logits: torch.Tensor, params: list[SamplingParams], token_ids: list[int],
                   candidates: dict[int, tuple[Candidates, int]]) -> tuple[list, list]:
    """For each row of logits (B, V) that asks: the sorted ids its token was drawn from, and logZ, the log of the
    softmax mass (after temperature) they keep: log pi_mask = log pi_full - logZ. candidates[row] = (its
    Candidates, its row there). Nothing truncated: None, 0.0; greedy: [token]; capped at SAMPLING_MASK_CAP ids."""
    masks, logz, asking = [None] * len(params), [None] * len(params), []
    for i, p in enumerate(params):
        if p.return_sampling_mask and (p.greedy or i in candidates):
            asking.append(i)
        elif p.return_sampling_mask:
            logz[i] = 0.0                                   # nothing truncated: the whole mass, no mask
    if not asking:
        return masks, logz
    t = torch.tensor([1.0 if params[i].greedy else params[i].temperature for i in asking], device=logits.device)
    full_mass = (rows(logits, asking).float() / t[:, None]).logsumexp(dim=-1)            # (n,)
    kept_mass = torch.empty_like(full_mass)
    greedy = [n for n, i in enumerate(asking) if params[i].greedy]
    if greedy:                                              # a point mass on the token
        kept_mass[greedy] = logits[[asking[n] for n in greedy], [token_ids[asking[n]] for n in greedy]].float()
        for n in greedy:
            masks[asking[n]] = [token_ids[asking[n]]]
    drawn_from = {}                                         # candidate set -> its asking rows: (n, row, j)
    for n, i in enumerate(asking):
        if not params[i].greedy:
            cand, j = candidates[i]
            drawn_from.setdefault(id(cand), (cand, []))[1].append((n, i, j))
    for cand, members in drawn_from.values():
        ns, js = [n for n, _, _ in members], [j for _, _, j in members]
        kept = cand.kept[js]                                # a prefix of each row
        kept_mass[ns] = cand.logits[js].masked_fill(~kept, -torch.inf).logsumexp(dim=-1)
        listed = torch.cat([kept.sum(dim=-1, keepdim=True), cand.ids[js, :SAMPLING_MASK_CAP]], dim=-1).tolist()
        for (_, i, _), (count, *ids) in zip(members, listed):
            ids = ids[:count]
            if token_ids[i] not in ids:
                ids[-1] = token_ids[i]
            masks[i] = sorted(ids)
    for n, value in enumerate((kept_mass - full_mass).tolist()):
        logz[asking[n]] = value
    return masks, logz


# notebooks/06a_logprobs.ipynb, cell 10
def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
           generator: torch.Generator | None = None, raw_logits: torch.Tensor | None = None) -> SamplerOutput:
    """One token per row of logits (B, V), each row with its own parameters, in one device->host transfer
    (more only for rows that ask for a sampling mask, or when top-p alone needs a full sort). Logprobs come from
    raw_logits, the model's own (default: logits). generators[row]: the request's own generator, or None."""
    vocab_size = logits.shape[1]
    tokens = torch.empty(len(params), dtype=torch.long, device=logits.device)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    full = [i for i, p in enumerate(params) if not truncates(p, vocab_size)]
    cut = [i for i, p in enumerate(params) if truncates(p, vocab_size) and not p.greedy]
    if greedy:
        put_rows(tokens, greedy, greedy_tokens(rows(logits, greedy)))
    if full:
        temperature = on_device([params[i].temperature for i in full], torch.float32, logits.device)[:, None]
        probs = (rows(logits, full).float() / temperature).softmax(dim=-1)              # (n, V)
        put_rows(tokens, full, random_sample(probs, [vocab_size] * len(full), [generators[i] for i in full],
                                             generator))
    candidates = {}
    if cut:
        drawn, cand = draw_truncated(rows(logits, cut), [params[i] for i in cut], [generators[i] for i in cut],
                                     generator)
        put_rows(tokens, cut, drawn)
        candidates.update({row: (cand, j) for j, row in enumerate(cut)})
    raw = logits if raw_logits is None else raw_logits
    token_ids, table = to_host(tokens, sampled_logprob_table(raw, params, tokens))      # one transfer
    redo = [i for i in cut if token_ids[i] < 0]
    if redo:  # exact fallback: these rows' top-p set is larger than TOP_P_CANDIDATES, so sort them whole
        again, cand = draw_truncated(logits[redo], [params[i] for i in redo], [generators[i] for i in redo],
                                     generator, whole=True)
        tokens[redo] = again
        for j, (row, token) in enumerate(zip(redo, again.tolist())):
            token_ids[row], candidates[row] = token, (cand, j)
        if table:                                                                       # rare
            table = sampled_logprob_table(raw, params, tokens).tolist()
    return SamplerOutput(token_ids, *sampling_masks(logits, params, token_ids, candidates),
                         logprob_dicts(params, token_ids, table))
