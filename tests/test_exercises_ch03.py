"""Chapter 03's checkers name what a typical wrong answer gets wrong."""

from rosellm_edu.exercises import ch03
from rosellm_edu.exercises.solutions import ch03 as solutions


def test_static_waste_rejects_padding_to_the_longest_prompt_of_the_whole_workload(capsys):
    def padded_to_global_longest(prompt_lens, output_lens, batch_size):
        pad = sum(max(prompt_lens) - p for p in prompt_lens)
        return pad, solutions.static_waste(prompt_lens, output_lens, batch_size)[1]

    assert not ch03.check_static_waste(padded_to_global_longest)
    out = capsys.readouterr().out
    assert out.startswith("✗ static batching waste") and "(pad positions, idle decode slots)" in out


def test_static_waste_rejects_a_last_batch_counted_as_full(capsys):
    def full_last_batch(prompt_lens, output_lens, batch_size):
        pad = idle = 0
        for i in range(0, len(prompt_lens), batch_size):
            p, o = prompt_lens[i:i + batch_size], output_lens[i:i + batch_size]
            pad += max(p) * batch_size - sum(p)
            idle += max(o) * batch_size - sum(o)
        return pad, idle

    assert not ch03.check_static_waste(full_last_batch)
    assert "expected" in capsys.readouterr().out


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
