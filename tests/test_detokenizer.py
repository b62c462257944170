"""The streamed text is the final text: a Sequence's detokenizer is primed with the prompt's tail, its text only
grows (a stop string may cut its held-back tail), bytes still held at the end are appended, and the deltas a
client receives (rosellm_edu.streaming.DeltaTracker) join to the final text."""

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.sequence import Sequence, prompt_tail
from rosellm_edu.streaming import DeltaTracker

EOS = 0


@functools.cache
def partial_byte_tokens(tokenizer) -> list[int]:
    """Tokens that are not whole characters alone: pieces of a multi-byte UTF-8 character."""
    return [t for t in range(len(tokenizer)) if "\ufffd" in tokenizer.decode([t])]


def token_ids(tokenizer, min_size: int, max_size: int):
    return st.lists(st.one_of(st.integers(0, len(tokenizer) - 1), st.sampled_from(partial_byte_tokens(tokenizer))),
                    min_size=min_size, max_size=max_size)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_streamed_deltas_join_to_the_final_text(tokenizer, data):
    prompt = data.draw(token_ids(tokenizer, 1, 12), "prompt")
    outputs = data.draw(token_ids(tokenizer, 1, 30), "outputs")
    whole = tokenizer.decode(outputs)
    stops = data.draw(st.lists(st.one_of(st.text(min_size=1, max_size=3),
                                         st.integers(0, max(0, len(whole) - 1)).map(lambda i: whole[i:i + 2])),
                               max_size=2).map(lambda s: [x for x in s if x]), "stop")
    params = SamplingParams(max_tokens=len(outputs), stop=stops,
                            stop_token_ids=data.draw(st.sampled_from([[], [outputs[-1]]])),
                            include_stop_str_in_output=data.draw(st.booleans()),
                            skip_special_tokens=data.draw(st.booleans()))
    seq, tracker, sent, texts = Sequence("r", None, prompt, params), DeltaTracker(), [], []
    tracker.add("r", params)
    for token in outputs:
        seq.append_token(token, tokenizer, eos_token_ids={EOS}, max_model_len=10**6)
        texts.append(seq.text)
        sent.append(tracker.next(seq.output())[0])
        if seq.finished:
            break
    assert seq.finished
    assert "".join(sent) == seq.text                                  # what was streamed is the final text
    for before, after in zip(texts, texts[1:]):
        cut = seq.finish_reason == "stop" and isinstance(seq.stop_reason, str) and after is texts[-1]
        assert after.startswith(before) or (cut and before.startswith(after))


def test_priming_with_the_prompt_tail_decodes_the_output_in_context(tokenizer):
    prompt = tokenizer("The capital of France is", add_special_tokens=False).input_ids
    outputs = tokenizer(" Paris, café 🤖 and more", add_special_tokens=False).input_ids
    seq = Sequence("r", None, prompt, SamplingParams(max_tokens=len(outputs)))
    for token in outputs:
        seq.append_token(token, tokenizer, eos_token_ids={EOS}, max_model_len=10**6)
    tail = prompt_tail(prompt, tokenizer)
    assert tail == prompt[-len(tail):] and len(tail) >= min(4, len(prompt))
    assert seq.text == tokenizer.decode(tail + outputs)[len(tokenizer.decode(tail)):] == " Paris, café 🤖 and more"


@pytest.mark.parametrize("keep", [False, True])
def test_bytes_held_at_a_stop_token_are_appended_not_redecoded(tokenizer, keep):
    emoji = tokenizer("🤖", add_special_tokens=False).input_ids
    assert len(emoji) > 1                                           # split over byte-level tokens
    prompt = tokenizer("Look:", add_special_tokens=False).input_ids
    seq = Sequence("r", None, prompt, SamplingParams(include_stop_str_in_output=keep))
    streamed = []
    for token in emoji[:-1] + [EOS]:
        seq.append_token(token, tokenizer, eos_token_ids={EOS}, max_model_len=10**6)
        streamed.append(seq.text)
    assert streamed[:-1] == [""] * (len(emoji) - 1)                 # held back while incomplete
    assert seq.finish_reason == "stop" and seq.text == tokenizer.decode(emoji[:-1])   # settled: "\ufffd"s appended
