"""Chapter 04 exercises: a prediction of the prompt tokens the model computes with prefix caching on and off, the
chained keys of a prompt's full blocks, and merging two partial online-softmax results. The prediction is compared
with a count on the engine (`rosellm_edu.engine.llm_engine`), the keys with those `BlockManager.commit` gives real
blocks (`rosellm_edu.engine.block_manager`), the merge with a plain softmax over all the keys."""

from __future__ import annotations

import functools

import torch

from rosellm_edu.exercises import Mismatch, checker, compare_prediction, expect_close, expect_equal

COMMON, OWN, BLOCK_SIZE = 22, 10, 8   # exercise 1: a shared beginning, each request's own tokens, the block size


def exercise_prompts(seed: int) -> list[list[int]]:
    """Exercise 1's four prompts: COMMON shared tokens, then OWN tokens of each one's own; the fourth repeats the
    first. A seed of their own per run, so that no run finds another's blocks in the cache."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randint(1000, 20000, (COMMON,), generator=g).tolist()
    prompts = [common + torch.randint(1000, 20000, (OWN,), generator=g).tolist() for _ in range(3)]
    return prompts + [list(prompts[0])]


def prompt_tokens_computed(engine, prompts: list[list[int]], together: bool, tag: str) -> int:
    """Token positions the model computes while engine serves prompts, one token each: all added before the first
    step (together), or each once the previous one has finished."""
    from rosellm_edu.sampling_params import SamplingParams

    rows = []
    hook = engine.model.register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[0]))
    try:
        for i, ids in enumerate(prompts):
            engine.add_request(f"{tag}-{i}", {"prompt_token_ids": ids},
                               SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
            while not together and engine.has_unfinished_requests():
                engine.step()
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        hook.remove()
    return sum(rows)


@functools.cache
def measured_prompt_tokens() -> dict[tuple[bool, bool], int]:
    """(prefix_caching, together) -> the prompt tokens the model computed for exercise 1's four requests."""
    from rosellm_edu.engine.llm_engine import LLMEngine

    counts = {}
    for caching in (False, True):
        engine = LLMEngine(dtype="float32", num_kv_blocks=64, block_size=BLOCK_SIZE, enable_prefix_caching=caching)
        for seed, together in enumerate((True, False)):
            counts[caching, together] = prompt_tokens_computed(engine, exercise_prompts(seed), together, str(seed))
    return counts


def _setting(caching: bool, together: bool) -> str:
    return f"prefix caching {'on' if caching else 'off'}, sent {'together' if together else 'one after another'}"


@checker("Predict the prefill, then measure it", predicts=True)
def check_prompt_tokens(predict) -> str:
    """predict(prefix_caching, together) -> the prompt tokens the model computes for four requests that share
    COMMON leading tokens (the fourth repeats the first), against a count on the engine."""
    settings = [(False, True), (False, False), (True, True), (True, False)]
    predicted = {s: predict(*s) for s in settings}       # the reader's numbers first: nothing is measured for nothing
    measured = measured_prompt_tokens()
    said = []
    for setting in settings:
        try:
            said.append(compare_prediction(predicted[setting], measured[setting], _setting(*setting),
                                           within=(0.98, 1.02), unit=" tokens"))
        except Mismatch as wrong:
            raise Mismatch(f"{wrong}{_hint(setting, predicted[setting])}") from None
    return "; ".join(said)


def _hint(setting: tuple[bool, bool], predicted) -> str:
    caching, together = setting
    prompt = COMMON + OWN
    if caching and together and predicted < 4 * prompt:
        return ("; a block is a cache hit only once its K/V are computed, and requests admitted in the same step all "
                "begin before any of them has computed a block")
    if caching and not together:
        shared, own = COMMON // BLOCK_SIZE * BLOCK_SIZE, prompt - COMMON
        if predicted in (prompt + 2 * own, prompt + 2 * own + BLOCK_SIZE, prompt + 3 * own):
            return "; the cache shares whole blocks only: how many full blocks do the common tokens fill?"
        if predicted == prompt + 2 * (prompt - shared):
            return ("; the repeated prompt is not all a hit: its last token never is, since the engine needs its "
                    "logits, and a block is a hit only as a whole")
        if predicted == prompt + 3 * (prompt - shared):
            return "; the fourth prompt repeats the first: more of it than the common beginning is cached"
    return ""


def _reference_keys(token_ids: list[int], block_size: int) -> list[bytes]:
    """The keys BlockManager.commit gives the full blocks of a sequence whose K/V are all computed."""
    from rosellm_edu.engine.block_manager import BlockManager
    from rosellm_edu.sampling_params import SamplingParams
    from rosellm_edu.sequence import Sequence

    bm = BlockManager(num_blocks=len(token_ids) // block_size + 1, block_size=block_size)
    seq = Sequence("x", None, list(token_ids), SamplingParams())
    bm.allocate(seq)
    bm.commit(seq, len(token_ids))
    table = bm.block_tables["x"]
    return [bm.blocks[b].hash for b in table[:len(token_ids) // block_size]]


@checker("Chained block keys")
def check_block_keys(fn) -> str:
    """fn(token_ids, block_size) -> the key of each full block, chain_hash(previous key, its tokens), against the
    keys the package's BlockManager gives the same blocks."""
    from rosellm_edu.engine.block_manager import chain_hash

    cases = [([1, 2, 3, 4, 5, 6, 7, 8], 4), ([1, 2, 3, 4, 5, 6, 7, 8, 9], 4), ([1, 2, 3], 4),
             ([9, 9, 9, 9, 9, 9], 2), (list(range(100, 164)), 16), ([5], 1)]
    for token_ids, block_size in cases:
        name = f"{len(token_ids)} tokens {token_ids[:6]}{'...' if len(token_ids) > 6 else ''}, block_size={block_size}"
        got = fn(list(token_ids), block_size)
        expected = _reference_keys(token_ids, block_size)
        if not isinstance(got, (list, tuple)) or not all(isinstance(k, bytes) for k in got):
            raise Mismatch(f"{name}: return a list of bytes keys (chain_hash's results), got {got!r:.80}")
        if len(got) != len(expected):
            hint = "; only full blocks get a key (a partly filled block may still change)" \
                if len(got) == -(-len(token_ids) // block_size) else ""
            raise Mismatch(f"{name}: {len(got)} keys, expected {len(expected)}{hint}")
        for i, (k, e) in enumerate(zip(got, expected)):
            if k != e:
                block = tuple(token_ids[i * block_size:(i + 1) * block_size])
                hint = "; chain it: each key hashes the previous block's key with the block's tokens" \
                    if k == chain_hash(None, block) else ""
                raise Mismatch(f"{name}: key of block {i} differs from the block manager's{hint}")
    a, b = [1, 2, 3, 4, 5, 6], [9, 9, 3, 4, 5, 6]
    expect_equal(sum(x == y for x, y in zip(fn(a, 2), fn(b, 2))), 0,
                 f"keys shared by {a} and {b} (same later blocks after a different first one)")
    return (f"your keys equal the block manager's on {len(cases)} prompts, and equal blocks after different "
            "beginnings get different keys")


def _partial(scores: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The online-softmax state after some keys: scores (heads, n), v (n, d) -> m (heads,), l (heads,),
    acc (heads, d). No keys: m = -inf, l = 0, acc = 0."""
    if scores.shape[1] == 0:
        return (torch.full(scores.shape[:1], float("-inf")), torch.zeros(scores.shape[0]),
                torch.zeros(scores.shape[0], v.shape[1]))
    m = scores.max(dim=1).values
    p = (scores - m[:, None]).exp()                             # (heads, n)
    return m, p.sum(dim=1), p @ v


@checker("Merging two partial softmax results")
def check_merge(fn) -> str:
    """fn(m1, l1, acc1, m2, l2, acc2) -> (m, l, acc), the state after both parts' keys, against the state of one
    pass over all of them; acc / l must equal softmax(scores) @ v."""
    g = torch.Generator().manual_seed(4)
    cases = [("four keys [1, 3 | 0.5, 4], one head, d=1", torch.tensor([[1.0, 3.0, 0.5, 4.0]]),
              torch.tensor([[10.0], [20.0], [30.0], [40.0]]), 2)]
    cases.append(("3 heads, 40 keys split 16 | 24, d=8", torch.randn(3, 40, generator=g), torch.randn(40, 8, generator=g), 16))
    big = torch.randn(2, 10, generator=g)
    big[:, 5:] += 60                                            # the second part dwarfs the first: exp(-60)
    cases.append(("the second part's scores 60 higher", big, torch.randn(10, 4, generator=g), 5))
    cases.append(("the first part empty (m1 = -inf, l1 = 0)", torch.randn(2, 6, generator=g),
                  torch.randn(6, 4, generator=g), 0))
    for name, scores, v, split in cases:
        first, second = _partial(scores[:, :split], v[:split]), _partial(scores[:, split:], v[split:])
        got = fn(*first, *second)
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            raise Mismatch(f"{name}: return a tuple (m, l, acc), got {type(got).__name__}")
        m, l, acc = got
        want_m, want_l, want_acc = _partial(scores, v)
        expect_close(m, want_m, f"{name}: m, the running max")
        if isinstance(l, torch.Tensor) and l.shape == want_l.shape and \
                torch.allclose(l, first[1] + second[1], rtol=1e-4) and not torch.allclose(l, want_l, rtol=1e-4):
            raise Mismatch(f"{name}: l is l1 + l2, but they were summed under different maxima: rescale each "
                           "part by exp(m_i - m) first")
        expect_close(l, want_l, f"{name}: l, the sum of exp(score - m)")
        expect_close(acc, want_acc, f"{name}: acc, the sum of exp(score - m) * v", rtol=1e-4, atol=1e-4)
        expect_close(acc / l[:, None], torch.softmax(scores, dim=1) @ v, f"{name}: acc / l against softmax @ v",
                     rtol=1e-4, atol=1e-4)
    return f"your merge gives the one-pass state on {len(cases)} cases, an empty part and a dwarfed one included"
