"""Chapter 07's checkers reject typical wrong answers and say what is wrong."""

import json

from rosellm_edu.exercises.ch07 import check_body_to_params, check_chat_usage, check_parse_sse
from rosellm_edu.exercises.solutions.ch07 import body_to_params, chat_usage, parse_sse
from rosellm_edu.sampling_params import SamplingParams


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


def test_body_to_params_that_ignores_unknown_fields_is_rejected(capsys):
    def lenient(body):
        known = {k: v for k, v in body.items() if k in {"temperature", "top_p", "top_k", "seed", "stop",
                                                         "ignore_eos"} and v is not None}
        return SamplingParams(max_tokens=body.get("max_tokens", 16), **known)

    assert not check_body_to_params(lenient)
    out = capsys.readouterr().out
    assert "presence_penalty" in out and "must refuse" in out


def test_body_to_params_that_passes_none_through_is_rejected(capsys):
    def passes_none(body):
        fields = {k: body[k] for k in ("temperature", "top_p", "top_k", "seed", "stop", "ignore_eos") if k in body}
        return SamplingParams(max_tokens=body.get("max_tokens", 16), **fields)

    assert not check_body_to_params(passes_none)
    assert "None" in capsys.readouterr().out


def test_body_to_params_whose_error_does_not_name_the_field_is_rejected(capsys):
    def vague(body):
        try:
            return body_to_params(body)
        except ValueError:
            raise ValueError("bad request") from None

    assert not check_body_to_params(vague)
    assert "does not name 'presence_penalty'" in capsys.readouterr().out
