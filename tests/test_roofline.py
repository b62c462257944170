"""benchmarks.roofline counts what a step computes and moves as a plain recomputation from the config does; the
floor is the slower of the two ceilings; the benchmarks report it."""

import pytest
import torch
from transformers import GPT2Config, LlamaConfig

from rosellm_edu.benchmarks.roofline import ModelCost, matmul_shapes, matmul_throughput, memory_bandwidth
from rosellm_edu.exercises.solutions.ch08 import decode_flops
from rosellm_edu.models import model_class
from rosellm_edu.sampling_params import SamplingParams


def llama(tied: bool, head_dim=None) -> LlamaConfig:
    return LlamaConfig(vocab_size=120, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied, head_dim=head_dim)


def build(config, dtype=torch.float32):
    with torch.device("meta"):
        return model_class(config)(config).to(dtype)


def llama_weights_by_hand(c: LlamaConfig) -> tuple[int, int]:
    """(matmul weights of the decoder layers, every weight a step reads) from the config alone."""
    d = c.head_dim or c.hidden_size // c.num_attention_heads
    attention = c.hidden_size * d * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    norms = 2 * c.hidden_size
    read = c.num_hidden_layers * (attention + mlp + norms) + c.hidden_size + c.vocab_size * c.hidden_size  # + head
    return c.num_hidden_layers * (attention + mlp), read


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_counts_match_the_config(tied, dtype):
    config = llama(tied)
    cost = ModelCost.of(build(config, dtype))
    layer_weights, read = llama_weights_by_hand(config)
    size = torch.empty(0, dtype=dtype).element_size()
    assert cost.layer_weights == layer_weights
    assert cost.head_weights == config.vocab_size * config.hidden_size
    assert cost.weight_bytes == read * size          # an untied embedding table is gathered, not read whole
    assert cost.kv_bytes_per_token == 2 * config.num_hidden_layers * config.num_key_value_heads * 16 * size


def test_gpt2_counts_match_the_config():
    config = GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    cost = ModelCost.of(build(config))
    h = config.n_embd
    per_layer = (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (h * 4 * h + h)   # with biases
    assert cost.layer_weights == config.n_layer * per_layer
    norms = config.n_layer * 4 * h + 2 * h
    assert cost.weight_bytes == 4 * (config.n_layer * per_layer + norms + config.vocab_size * h)  # wte as the head
    assert (cost.heads, cost.head_dim) == (4, 8)


@pytest.mark.parametrize("contexts", [[0], [3, 17, 100], [4095, 1]])
def test_decode_flops_match_a_recomputation(contexts):
    config = llama(True)
    assert ModelCost.of(build(config)).step_flops(contexts, [1] * len(contexts)) == decode_flops(config, contexts)


def test_prefill_attention_counts_causal_pairs():
    config = llama(True)
    cost = ModelCost.of(build(config))
    computed, new = [5, 0], [3, 4]
    pairs = sum(c + j + 1 for c, n in zip(computed, new) for j in range(n))    # 6 + 7 + 8 + 1 + 2 + 3 + 4
    attention = 4 * config.num_hidden_layers * config.num_attention_heads * 16 * pairs
    expected = 2 * cost.layer_weights * 7 + 2 * cost.head_weights * 2 + attention
    assert cost.step_flops(computed, new) == expected
    assert cost.step_bytes(computed, new) == cost.weight_bytes + cost.kv_bytes_per_token * (8 + 4 + 7)


def test_the_floor_is_the_slower_ceiling():
    cost = ModelCost.of(build(llama(True)))
    flops, moved = cost.step_flops([10], [1]), cost.step_bytes([10], [1])
    assert cost.step_floor([10], [1], flops_per_s=flops, bytes_per_s=moved / 3) == pytest.approx(3.0)
    assert cost.step_floor([10], [1], flops_per_s=flops / 5, bytes_per_s=moved) == pytest.approx(5.0)


def test_ceilings_are_measured_and_positive():
    model = model_class(llama(True))(llama(True))
    layer = {(m.in_features, m.out_features) for m in model.model.layers[0].modules() if isinstance(m, torch.nn.Linear)}
    assert matmul_shapes(model, 8) == sorted((8, i, o) for i, o in layer | {(64, 120)})     # the LM head too
    assert memory_bandwidth(num_bytes=8 * 2**20, repeat=2) > 0
    assert matmul_throughput(matmul_shapes(model, 8), torch.float32, repeat=1) > 0


def test_mixed_bench_splits_the_floor_and_the_time_by_kind_of_step():
    from rosellm_edu.benchmarks.mixed import StepClock
    from rosellm_edu.engine.llm_engine import LLMEngine
    from rosellm_edu.streaming import Request, stream

    engine = LLMEngine(dtype="float32", num_kv_blocks=64, max_num_batched_tokens=24, enable_prefix_caching=False)
    clock = StepClock(engine)
    prompts = [list(range(100, 140)), list(range(200, 210))]
    requests = [Request(str(i), {"prompt_token_ids": p}, SamplingParams(max_tokens=3, ignore_eos=True))
                for i, p in enumerate(prompts)]
    for _ in stream(engine, requests):
        pass
    new = [n for _, ns, _ in clock.steps for n in ns]
    assert sum(new) == sum(len(p) + 3 - 1 for p in prompts)        # every position computed once, the last not
    floors = clock.floors(engine.model, engine.device)
    cost = ModelCost.of(engine.model)
    flops, moved = floors["matmul_gflop_s"] * 1e9, floors["bandwidth_gb_s"] * 1e9
    decode = [(c, n) for c, n, _ in clock.steps if all(x == 1 for x in n)]
    prefill = [(c, n) for c, n, _ in clock.steps if not all(x == 1 for x in n)]
    assert (floors["decode_steps"], floors["prefill_steps"]) == (len(decode), len(prefill)) and prefill and decode
    assert floors["decode_floor_s"] == pytest.approx(sum(cost.step_floor(c, n, flops, moved) for c, n in decode))
    assert floors["prefill_floor_s"] == pytest.approx(sum(cost.step_floor(c, n, flops, moved) for c, n in prefill))
    assert floors["roofline_floor_s"] == pytest.approx(floors["decode_floor_s"] + floors["prefill_floor_s"])
    assert floors["decode_time_s"] + floors["prefill_time_s"] == pytest.approx(sum(t for _, _, t in clock.steps))
