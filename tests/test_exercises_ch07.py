"""Chapter 07's checkers reject typical wrong answers and say what is wrong."""

import json

from rosellm_edu.exercises.ch07 import check_chat_usage, check_engine_steps, check_parse_sse
from rosellm_edu.exercises.solutions.ch07 import chat_usage, predict_steps


def test_parse_sse_that_needs_the_space_after_data_is_rejected(capsys):
    def needs_the_space(text):
        out = []
        for line in text.splitlines():
            if line.startswith("data: "):
                if line[6:] == "[DONE]":
                    break
                out.append(json.loads(line[6:]))
        return out

    assert not check_parse_sse(needs_the_space)
    assert "data:{" in capsys.readouterr().out   # names the stream written without the space


def test_parse_sse_that_reads_past_done_is_rejected(capsys):
    def past_done(text):
        return [json.loads(line[5:]) for line in text.splitlines()
                if line.startswith("data:") and line[5:].strip() != "[DONE]"]

    assert not check_parse_sse(past_done)
    assert "late" in capsys.readouterr().out


def test_parse_sse_that_crashes_on_done_is_reported(capsys):
    def json_everything(text):
        return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]

    assert not check_parse_sse(json_everything)
    assert "raised JSONDecodeError" in capsys.readouterr().out


def test_chat_usage_that_counts_only_the_messages_text_is_rejected(capsys):
    def text_only(tokenizer, messages, completion_token_ids):
        prompt = sum(len(tokenizer.encode(m["content"], add_special_tokens=False)) for m in messages)
        return {"prompt_tokens": prompt, "completion_tokens": len(completion_token_ids),
                "total_tokens": prompt + len(completion_token_ids)}

    assert not check_chat_usage(text_only)
    out = capsys.readouterr().out
    assert "prompt_tokens" in out and "chat template" in out


def test_chat_usage_without_the_opened_assistant_turn_is_rejected(capsys):
    def no_generation_prompt(tokenizer, messages, completion_token_ids):
        prompt = len(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
        return {"prompt_tokens": prompt, "completion_tokens": len(completion_token_ids),
                "total_tokens": prompt + len(completion_token_ids)}

    assert not check_chat_usage(no_generation_prompt)
    assert "prompt_tokens" in capsys.readouterr().out


def test_chat_usage_with_a_wrong_total_is_rejected(capsys):
    def no_total(tokenizer, messages, completion_token_ids):
        return {**chat_usage(tokenizer, messages, completion_token_ids), "total_tokens": 0}

    assert not check_chat_usage(no_total)
    assert "total_tokens" in capsys.readouterr().out


def test_a_step_count_that_sums_the_requests_is_rejected_with_a_hint(capsys):
    def one_at_a_time(max_tokens, arrivals, max_num_seqs):
        return sum(max_tokens)

    assert not check_engine_steps(one_at_a_time)
    out = capsys.readouterr().out
    assert "arrivals [0, 0, 0, 0, 0]" in out and "share each step" in out


def test_a_step_count_that_ignores_arrivals_and_seats_is_rejected(capsys):
    def longest(max_tokens, arrivals, max_num_seqs):
        return sum(max_tokens) if arrivals[0] is None else max(max_tokens)

    assert not check_engine_steps(longest)
    out = capsys.readouterr().out
    assert "arrivals [0, 2, 4, 6, 14]" in out and "seats at most 4" in out


def test_a_step_count_off_by_one_is_rejected(capsys):
    assert not check_engine_steps(lambda *workload: predict_steps(*workload) + 1)
    assert "within 0.98x to 1.02x" in capsys.readouterr().out


def test_a_prediction_that_is_not_a_number_is_rejected(capsys):
    assert not check_engine_steps(lambda *workload: str(predict_steps(*workload)))
    assert "predict a number" in capsys.readouterr().out
