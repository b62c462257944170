"""Worked solutions to chapter 03's exercises."""


def predict_steps(prompt_lens, output_lens, max_num_seqs):
    free_at = [0] * max_num_seqs            # the step from which each seat is free
    for n in output_lens:                   # arrival order: each request takes the seat that frees first
        seat = free_at.index(min(free_at))  # its first step prefills the prompt and samples the first token,
        free_at[seat] += n                  # then one token per step: n steps in all
    return max(free_at)


def schedule_step(running, waiting, max_num_seqs, max_num_batched_tokens):
    budget, batch = max_num_batched_tokens, []
    for request_id, tokens_left in running:          # running sequences first, in order
        if budget == 0:
            break
        n = min(tokens_left, budget)                 # a long prefill is cut to what the budget allows
        batch.append((request_id, n))
        budget -= n
    seats = max_num_seqs - len(running)
    for request_id, prompt_len in waiting:           # then new ones, in arrival order
        if budget == 0 or seats == 0:
            break
        n = min(prompt_len, budget)
        batch.append((request_id, n))
        budget -= n
        seats -= 1
    return batch


def first_token_steps(prompt_lens, output_lens, max_num_seqs, max_num_batched_tokens):
    waiting = list(range(len(prompt_lens)))
    running = []                          # request indices, in admission order
    left = {}                             # request -> positions still to compute before it samples
    produced = [0] * len(prompt_lens)
    first = [None] * len(prompt_lens)
    step = 0
    while waiting or running:
        batch = schedule_step([(i, left[i]) for i in running], [(i, prompt_lens[i]) for i in waiting],
                              max_num_seqs, max_num_batched_tokens)
        for i, n in batch:
            if i in waiting:
                waiting.remove(i)
                running.append(i)
                left[i] = prompt_lens[i]
            left[i] -= n
            if left[i] == 0:              # reached its last position: it samples a token this step
                produced[i] += 1
                if first[i] is None:
                    first[i] = step
                left[i] = 1               # next step computes the token it just sampled
                if produced[i] == output_lens[i]:
                    running.remove(i)
        step += 1
    return first


SOLUTIONS = {"check_engine_steps": predict_steps, "check_schedule_step": schedule_step,
             "check_first_token_steps": first_token_steps}
