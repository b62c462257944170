"""Prompt logprobs bounded per step (appendix 06a): a request that owes prompt logprobs prefills in chunks of at most
LLMEngine's prompt_logprobs_chunk positions, its table is computed in slices of that many rows, and the logprobs
are those of an engine that takes the prompt in one step."""

import pytest

from rosellm_edu.engine import llm_engine
from rosellm_edu.engine.llm_engine import LLMEngine
from rosellm_edu.sampling_params import SamplingParams

PROMPT = " ".join(["The capital of France is Paris, and the capital of Italy is Rome."] * 4)
TABLE = llm_engine.logprob_table


def run(chunk: int, monkeypatch) -> tuple[list[dict], list[int], object]:
    """Positions each step computed per request, the rows of every logprob table, and the long request's output."""
    eng = LLMEngine(dtype="float32", num_kv_blocks=64, prompt_logprobs_chunk=chunk)
    steps, rows, forward = [], [], eng.forward
    eng.forward = lambda batch: steps.append({s.seq.request_id: s.num_new for s in batch}) or forward(batch)
    monkeypatch.setattr(llm_engine, "logprob_table", lambda logits, *a: rows.append(len(logits)) or TABLE(logits, *a))
    eng.add_request("chat", "Once upon a time", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    eng.add_request("long", PROMPT, SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=3))
    finals = {}
    while eng.has_unfinished_requests():
        finals |= {o.request_id: o for o in eng.step() if o.finished}
    return steps, rows, finals


@pytest.mark.parametrize("chunk", [7])
def test_chunks_bound_each_step_and_keep_the_logprobs(chunk, monkeypatch):
    steps, rows, finals = run(chunk, monkeypatch)
    whole_steps, _, whole = run(4096, monkeypatch)
    prompt_len = len(finals["long"].prompt_token_ids)
    assert max(s.get("long", 0) for s in steps) <= chunk and max(rows) <= chunk
    assert sum(s.get("long", 0) for s in steps) == prompt_len + 2               # + 2 decodes: nothing twice
    assert all("chat" in s and "long" in s for s in steps[:6])                  # chat decodes between the chunks
    ours, theirs = finals["long"].prompt_logprobs, whole["long"].prompt_logprobs
    assert ours[0] is None and len(ours) == len(theirs) == prompt_len
    for a, b in zip(ours[1:], theirs[1:]):
        assert a.keys() == b.keys()
        assert all(abs(a[t].logprob - b[t].logprob) < 1e-4 and a[t].decoded_token == b[t].decoded_token for t in a)
    assert finals["long"].outputs[0].token_ids == whole["long"].outputs[0].token_ids
    assert finals["chat"].outputs[0].token_ids == whole["chat"].outputs[0].token_ids


@pytest.mark.parametrize("chunk", [0, -1, 2.5])
def test_prompt_logprobs_chunk_must_be_a_positive_integer(chunk):
    with pytest.raises(ValueError, match="prompt_logprobs_chunk"):
        LLMEngine(dtype="float32", num_kv_blocks=8, prompt_logprobs_chunk=chunk)
