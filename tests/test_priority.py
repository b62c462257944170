"""Priority scheduling (appendix 04a), as vLLM's scheduling_policy="priority": lower priority values run first, the
waiting queue is ordered by (priority, arrival), and a waiting request of higher priority preempts the running
sequences ranked lowest when it lacks a seat or blocks."""

import pytest

from rosellm_edu.engine.llm_engine import LLMEngine
from rosellm_edu.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPTS = {"a": "The capital of France is", "b": "Once upon a time", "c": "def fibonacci(n):", "d": "Water boils at"}


def engine(policy: str = "priority", **sizes) -> LLMEngine:
    return LLMEngine(dtype="float32", num_kv_blocks=64, block_size=4, scheduling_policy=policy, **sizes)


def run(eng: LLMEngine) -> tuple[list[str], dict[str, list[int]]]:
    """Step to the end: the order in which requests first sampled, and each one's final tokens."""
    order, tokens = [], {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.request_id not in order:
                order.append(out.request_id)
            if out.finished:
                tokens[out.request_id] = [list(c.token_ids) for c in out.outputs]
    return order, tokens


def alone(rid: str, params: SamplingParams = GREEDY) -> list[list[int]]:
    eng = engine("fcfs")
    eng.add_request(rid, PROMPTS[rid], params)
    return run(eng)[1][rid]


def test_an_unknown_policy_is_refused_by_name():
    with pytest.raises(ValueError, match="scheduling_policy.*'lottery'"):
        engine("lottery")


def test_a_priority_that_is_not_an_integer_is_refused():
    eng = engine()
    with pytest.raises(ValueError, match="priority"):
        eng.add_request("a", PROMPTS["a"], GREEDY, priority=0.5)


@pytest.mark.parametrize("policy, expected", [("fcfs", ["a", "b", "c", "d"]), ("priority", ["c", "a", "d", "b"])])
def test_admission_follows_priority_then_arrival(policy, expected):
    eng = engine(policy, max_num_seqs=1)
    for rid, priority in zip("abcd", [1, 2, 0, 1]):
        eng.add_request(rid, PROMPTS[rid], GREEDY, priority=priority)
    order, tokens = run(eng)
    assert order == expected
    assert all(tokens[rid] == alone(rid) for rid in "abcd")


def test_a_higher_priority_arrival_preempts_the_lowest_ranked_running_sequence():
    eng = engine(max_num_seqs=2)
    eng.add_request("a", PROMPTS["a"], GREEDY, priority=1)
    eng.add_request("b", PROMPTS["b"], GREEDY, priority=2)
    eng.step()
    assert [s.request_id for s in eng.scheduler.running] == ["a", "b"]
    eng.add_request("c", PROMPTS["c"], GREEDY, priority=0)
    eng.step()
    assert [s.request_id for s in eng.scheduler.running] == ["a", "c"]
    assert [s.request_id for s in eng.scheduler.waiting] == ["b"] and eng.scheduler.num_preemptions == 1
    _, tokens = run(eng)
    assert all(tokens[rid] == alone(rid) for rid in "bc")


def test_a_lower_priority_arrival_waits_and_fcfs_never_preempts_for_a_waiting_request():
    for policy, priority in [("priority", 3), ("fcfs", -5)]:
        eng = engine(policy, max_num_seqs=2)
        eng.add_request("a", PROMPTS["a"], GREEDY, priority=1)
        eng.add_request("b", PROMPTS["b"], GREEDY, priority=2)
        eng.step()
        eng.add_request("c", PROMPTS["c"], GREEDY, priority=priority)
        eng.step()
        assert [s.request_id for s in eng.scheduler.waiting] == ["c"] and eng.scheduler.num_preemptions == 0


def test_a_short_request_is_not_starved_by_a_large_n():
    """One request holds every seat with its n samples; a priority request takes a seat from one of them, and
    every sample still finishes with its tokens."""
    eng = engine(max_num_seqs=4)
    many = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, n=4)
    eng.add_request("a", PROMPTS["a"], many, priority=1)
    eng.step(), eng.step()
    assert len(eng.scheduler.running) == 4
    eng.add_request("d", PROMPTS["d"], GREEDY)
    finished = []
    while eng.has_unfinished_requests():
        finished += [o.request_id for o in eng.step() if o.finished]
    assert finished == ["d", "a"]


@pytest.mark.parametrize("policy, victim", [("fcfs", "a"), ("priority", "b")])
def test_a_sequence_short_of_blocks_preempts_the_lowest_ranked(policy, victim):
    """Two sequences outgrow a pool of 5 blocks: "fcfs" preempts the newest (a), "priority" the lowest ranked (b)."""
    eng = LLMEngine(dtype="float32", num_kv_blocks=5, block_size=4, scheduling_policy=policy)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    eng.add_request("b", PROMPTS["b"], params, priority=1)
    eng.add_request("a", PROMPTS["a"], params, priority=0)
    preempted, tokens = set(), {}
    while eng.has_unfinished_requests():
        tokens |= {o.request_id: [list(o.outputs[0].token_ids)] for o in eng.step() if o.finished}
        preempted |= {s.request_id for s in eng.scheduler.waiting}
    assert preempted == {victim}
    assert tokens == {"a": alone("a", params), "b": alone("b", params)}
