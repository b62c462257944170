"""Chapter 03's exercises: a prediction of the steps the engine takes for a few requests, measured by stepping it;
one scheduling decision; and when each request of a continuous batch gets its first token."""

from __future__ import annotations

import functools

from rosellm_edu.exercises import checker, compare_prediction, expect_equal, tiny_model_dir


@functools.cache
def tiny_engine(max_num_seqs: int):
    """The engine on chapter 02's tiny random model: how many steps a workload takes does not depend on weights."""
    from rosellm_edu.engine.llm_engine import LLMEngine

    engine = LLMEngine(tiny_model_dir(), dtype="float32", max_num_seqs=max_num_seqs, num_kv_blocks=64)
    engine.model.model.fusion = "torch"   # where a later chapter calibrates kernels: no timing, only counting
    return engine


def engine_steps(prompt_lens: list[int], output_lens: list[int], max_num_seqs: int) -> int:
    """Add every request at once, then step the engine until all are done; the number of steps."""
    from rosellm_edu.sampling_params import SamplingParams

    engine, steps = tiny_engine(max_num_seqs), 0
    for i, (prompt_len, output_len) in enumerate(zip(prompt_lens, output_lens)):
        prompt = list(range(100 + 50 * i, 100 + 50 * i + prompt_len))         # no two prompts share a prefix
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt},
                           SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return steps


@checker("Predict the engine's steps", predicts=True)
def check_engine_steps(predict_steps) -> str:
    """predict_steps(prompt_lens, output_lens, max_num_seqs) -> the steps the engine takes for these requests."""
    cases = [([6, 3, 4, 5], [5, 2, 7, 3], 1), ([6, 3, 4, 5], [5, 2, 7, 3], 2), ([12, 2, 9, 4, 7], [1, 4, 2, 6, 3], 2)]
    predicted = [predict_steps(list(p), list(o), m) for p, o, m in cases]
    said = []
    for (prompt_lens, output_lens, max_num_seqs), guess in zip(cases, predicted):
        said.append(compare_prediction(guess, engine_steps(prompt_lens, output_lens, max_num_seqs),
                                       f"outputs {output_lens}, max_num_seqs={max_num_seqs}", within=(0.95, 1.05),
                                       unit=" steps"))
    return "; ".join(said)


def scheduler_with(running: list[tuple[str, int]], waiting: list[tuple[str, int]], max_num_seqs: int,
                   max_num_batched_tokens: int):
    """The chapter's Scheduler in the state the exercise describes: each running sequence has tokens_left positions
    still to compute, each waiting one a prompt of prompt_len; blocks are never short."""
    from rosellm_edu.engine.block_manager import BlockManager
    from rosellm_edu.engine.scheduler import Scheduler
    from rosellm_edu.sampling_params import SamplingParams
    from rosellm_edu.sequence import Sequence, SequenceStatus

    scheduler = Scheduler(BlockManager(100_000, 16, 1_000_000), max_num_seqs, max_num_batched_tokens)
    token = iter(range(100, 10_000))     # a different token per request: no two share a prefix
    for request_id, tokens_left in running:
        seq = Sequence(request_id, None, [next(token)] * tokens_left, SamplingParams(max_tokens=1))
        seq.status = SequenceStatus.RUNNING
        scheduler.running.append(seq)
        scheduler.requests[request_id], scheduler.num_computed[request_id] = seq, 0
        scheduler.block_manager.allocate(seq)
    for request_id, prompt_len in waiting:
        scheduler.add(Sequence(request_id, None, [next(token)] * prompt_len, SamplingParams(max_tokens=1)))
    return scheduler


@checker("one scheduling step")
def check_schedule_step(fn) -> str:
    cases = [([("a", 1), ("b", 1), ("c", 50)], [("d", 30), ("e", 8)], 4, 64),
             ([], [("a", 5), ("b", 5), ("c", 5)], 8, 100),
             ([], [("a", 5), ("b", 5), ("c", 5)], 2, 100),
             ([("a", 1), ("b", 1)], [("c", 5)], 2, 100),
             ([("a", 40), ("b", 1), ("c", 1)], [("d", 3)], 8, 32),
             ([("a", 1), ("b", 1)], [("c", 100)], 8, 2),
             ([("a", 1)], [("b", 200), ("c", 2)], 8, 64),
             ([("a", 1)], [], 8, 64)]
    for running, waiting, max_num_seqs, budget in cases:
        expected = [(s.seq.request_id, s.num_new)
                    for s in scheduler_with(running, waiting, max_num_seqs, budget).schedule()]
        got = fn(list(running), list(waiting), max_num_seqs, budget)
        expect_equal([tuple(x) for x in got] if isinstance(got, list) else got, expected,
                     f"the step for running={running}, waiting={waiting}, max_num_seqs={max_num_seqs}, "
                     f"max_num_batched_tokens={budget}")
    return (f"all {len(cases)} cases match the chapter's Scheduler: running sequences first, prompts chunked to "
            f"the token budget, no admission without a seat or a token left")


def first_token_steps_reference(prompt_lens: list[int], output_lens: list[int], max_num_seqs: int,
                                max_num_batched_tokens: int) -> list[int]:
    """Drive the chapter's Scheduler with dummy tokens; note the step in which each request samples first."""
    scheduler = scheduler_with([], [(str(i), p) for i, p in enumerate(prompt_lens)], max_num_seqs,
                               max_num_batched_tokens)
    first: dict[int, int] = {}
    step = 0
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        scheduler.computed(batch)
        for s in batch:
            if s.samples:
                i = int(s.seq.request_id)
                first.setdefault(i, step)
                s.seq.output_token_ids.append(2)
                if len(s.seq.output_token_ids) == output_lens[i]:
                    scheduler.remove(s.seq)
        step += 1
    return [first[i] for i in range(len(prompt_lens))]


@checker("first-token steps under continuous batching")
def check_first_token_steps(fn) -> str:
    cases = [([6, 3, 4], [2, 1, 2], 2, 8), ([4, 4, 4, 4], [3, 1, 2, 1], 2, 100), ([10, 2], [1, 1], 4, 4),
             ([5], [3], 1, 1), ([3, 3, 3], [1, 1, 1], 1, 100), ([20, 1, 1, 7], [4, 2, 5, 1], 3, 6),
             ([2, 9, 4, 1, 8], [6, 2, 1, 3, 2], 2, 5)]
    for prompt_lens, output_lens, max_num_seqs, budget in cases:
        expected = first_token_steps_reference(prompt_lens, output_lens, max_num_seqs, budget)
        got = fn(list(prompt_lens), list(output_lens), max_num_seqs, budget)
        expect_equal(got, expected, f"first-token steps for prompts {prompt_lens}, outputs {output_lens}, "
                                    f"max_num_seqs={max_num_seqs}, max_num_batched_tokens={budget}")
    return (f"all {len(cases)} cases match the chapter's Scheduler, chunked prompts and refilled seats "
            f"included")
