"""Chapter 03's checkers name what a typical wrong answer gets wrong."""

from rosellm_edu.exercises import ch03
from rosellm_edu.exercises.solutions import ch03 as solutions


def test_predicting_the_tokens_shared_evenly_among_the_seats_is_rejected(capsys):
    assert not ch03.check_engine_steps(lambda prompt_lens, output_lens, max_num_seqs: sum(output_lens) / max_num_seqs)
    out = capsys.readouterr().out
    assert out.startswith("✗ Predict the engine's steps") and "max_num_seqs=2: you predicted 8.5 steps" in out


def test_predicting_a_separate_step_for_each_prefill_is_rejected(capsys):
    def prefill_apart(prompt_lens, output_lens, max_num_seqs):
        return solutions.predict_steps(prompt_lens, [n + 1 for n in output_lens], max_num_seqs)

    assert not ch03.check_engine_steps(prefill_apart)
    assert "the engine measured 17 steps" in capsys.readouterr().out


def test_schedule_step_rejects_admitting_new_requests_before_the_running_ones(capsys):
    def prefill_first(running, waiting, max_num_seqs, budget):
        return solutions.schedule_step([], waiting + running, max_num_seqs + len(running), budget)

    assert not ch03.check_schedule_step(prefill_first)
    out = capsys.readouterr().out
    assert out.startswith("✗ one scheduling step") and "running=" in out


def test_schedule_step_rejects_ignoring_max_num_seqs(capsys):
    def no_seat_limit(running, waiting, max_num_seqs, budget):
        return solutions.schedule_step(running, waiting, 10**9, budget)

    assert not ch03.check_schedule_step(no_seat_limit)
    assert "max_num_seqs=2" in capsys.readouterr().out


def test_schedule_step_rejects_prompts_that_are_not_chunked(capsys):
    def whole_prompts_only(running, waiting, max_num_seqs, budget):
        batch, left = [], budget
        for request_id, n in running + waiting[:max(0, max_num_seqs - len(running))]:
            if n <= left:
                batch.append((request_id, n))
                left -= n
        return batch

    assert not ch03.check_schedule_step(whole_prompts_only)
    assert "expected" in capsys.readouterr().out


def test_first_token_steps_rejects_prompts_prefilled_in_one_step(capsys):
    def unchunked(prompt_lens, output_lens, max_num_seqs, budget):
        return solutions.first_token_steps(prompt_lens, output_lens, max_num_seqs, 10**9)

    assert not ch03.check_first_token_steps(unchunked)
    out = capsys.readouterr().out
    assert out.startswith("✗ first-token steps") and "max_num_batched_tokens" in out


def test_first_token_steps_rejects_groups_that_wait_for_the_previous_group(capsys):
    def static_like(prompt_lens, output_lens, max_num_seqs, budget):
        steps, start = [], 0
        for i in range(0, len(prompt_lens), max_num_seqs):   # a group waits for the whole previous group
            group = range(i, min(i + max_num_seqs, len(prompt_lens)))
            firsts = solutions.first_token_steps([prompt_lens[j] for j in group], [output_lens[j] for j in group],
                                                 max_num_seqs, budget)
            steps += [start + f for f in firsts]
            start += max(f + output_lens[j] for f, j in zip(firsts, group))
        return steps

    assert not ch03.check_first_token_steps(static_like)
    assert "first-token steps for prompts" in capsys.readouterr().out
