"""Chapter 05's exercises: a prediction of the padded rows a run's decode batches cost in their buckets, measured
on the engine's runner; the static inputs of one decode step; and kernels told apart from views in a list of ATen
operations."""

from __future__ import annotations

import torch

from rosellm_edu.exercises import Mismatch, checker, compare_prediction, expect_equal, tiny_model_dir


def decode_batch_sizes(output_lens: list[int], max_num_seqs: int) -> tuple[list[int], object]:
    """Serve requests that arrive together on the engine (chapter 02's tiny model) and record the size of every
    decode batch its runner gets; returns them and the runner."""
    from rosellm_edu.engine.llm_engine import LLMEngine
    from rosellm_edu.sampling_params import SamplingParams

    engine = LLMEngine(tiny_model_dir(), dtype="float32", max_num_seqs=max_num_seqs, num_kv_blocks=64)
    engine.model.model.fusion = "torch"   # where a later chapter calibrates kernels: no timing, only counting
    runner, sizes, run = engine.runner, [], engine.runner.run

    def recording_run(batch, *args, **kwargs):
        if runner.is_decode(batch):
            sizes.append(len(batch))
        return run(batch, *args, **kwargs)

    runner.run = recording_run
    for i, n in enumerate(output_lens):
        engine.add_request(f"r{i}", {"prompt_token_ids": [100 + i, 7, 8]},
                           SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return sizes, runner


@checker("Predict the padded rows", predicts=True)
def check_padded_rows(predict_padded_rows) -> str:
    """predict_padded_rows(output_lens, max_num_seqs) -> the padded rows the graphs replay over a whole run."""
    cases = [(list(range(1, 21)), 32), ([4] * 5, 8)]
    predicted = [predict_padded_rows(list(lens), m) for lens, m in cases]
    said = []
    for (output_lens, max_num_seqs), guess in zip(cases, predicted):
        sizes, runner = decode_batch_sizes(output_lens, max_num_seqs)
        padded = sum(runner.padded_size(n) - n for n in sizes)     # each decode batch, padded to its bucket
        said.append(compare_prediction(guess, padded, f"{len(output_lens)} requests, max_num_seqs={max_num_seqs}",
                                       within=(0.9, 1.1), unit=" rows"))
    return "; ".join(said)


class _Model:
    """What ModelRunner reads of a model when it allocates its buffers."""

    def __init__(self, config):
        self.config = config


def _decode_cases():
    """(tokens, positions, tables, rows): one sequence; block boundaries; short tables; padding; no padding."""
    return [([5], [17], [[3, 9]], 2),
            ([11], [0], [[4]], 1),
            ([1, 2, 3], [15, 16, 40], [[0], [1, 2], [5, 6, 7]], 4),
            ([7, 8, 9, 10, 11], [3, 31, 32, 0, 47], [[2], [3, 4], [5, 6, 8], [9], [10, 11, 12]], 8),
            ([6, 6], [63, 1], [[13, 14, 15, 16], [17]], 2)]


@checker("decode_inputs")
def check_decode_inputs(fn) -> str:
    """fn(tokens, positions, tables, rows, block_size, scratch_block) -> the five static inputs, as chapter 05's
    ModelRunner.prepare_decode writes them (chapter 08 later pads short tables differently)."""
    from transformers import LlamaConfig

    from rosellm_edu.book.chapter import package_as_of

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    block_size = 16
    cases = _decode_cases()
    with package_as_of("06_fast_sampling.ipynb") as load:   # the package as chapter 05 leaves it
        cache = load("engine.kv_cache").KVCache(config, 24, block_size)
        runner = load("engine.model_runner").ModelRunner(_Model(config), cache, 8, 128, enforce_eager=True)
        Sequence, SamplingParams = load("sequence").Sequence, load("sampling_params").SamplingParams
        ScheduledSeq = load("engine.scheduler").ScheduledSeq
        references = []
        for tokens, positions, tables, rows in cases:
            batch = [ScheduledSeq(Sequence(str(i), None, [0] * p + [t], SamplingParams()), p, 1)
                     for i, (t, p) in enumerate(zip(tokens, positions))]
            width = runner.prepare_decode(batch, tables, rows)
            inputs = {name: getattr(runner, name)[:rows].clone()
                      for name in ("input_ids", "positions", "slot_mapping", "context_lens")}
            references.append(inputs | {"block_tables": runner.block_tables[:rows, :width].clone()})
    for (tokens, positions, tables, rows), expected in zip(cases, references):
        got = fn(list(tokens), list(positions), [list(t) for t in tables], rows, block_size, cache.scratch_block)
        where = f"decode_inputs({tokens}, {positions}, {tables}, rows={rows}, block_size={block_size}, " \
                f"scratch_block={cache.scratch_block})"
        if not isinstance(got, dict) or set(got) != set(expected):
            raise Mismatch(f"{where}: expected a dict with keys {sorted(expected)}, got "
                           f"{sorted(got) if isinstance(got, dict) else type(got).__name__}")
        for name, want in expected.items():
            expect_equal(torch.as_tensor(got[name]).tolist(), want.tolist(), f"{where}[{name!r}]")
    return f"all {len(cases)} batches give the runner's static inputs, padded rows and short tables included"


def _recorded(fn) -> list:
    from rosellm_edu.benchmarks.launches import RecordOps

    with torch.no_grad(), RecordOps() as record:
        fn()
    return record.ops


def _launch_cases() -> list[tuple[str, list]]:
    x = torch.randn(4, 4)
    return [("x.view(16)", _recorded(lambda: x.view(16))),
            ("x.t() @ x", _recorded(lambda: x.t() @ x)),
            ("x.add_(1)", _recorded(lambda: x.add_(1))),
            ("torch.empty_like(x)", _recorded(lambda: torch.empty_like(x))),
            ("x.float() on a float32 x", _recorded(lambda: x.float())),
            ("x[0], x[1:], x[[0, 2]]", _recorded(lambda: (x[0], x[1:], x[[0, 2]]))),
            ("x.chunk(2) then cat", _recorded(lambda: torch.cat(x.chunk(2)[::-1]))),
            ("x.unsqueeze(0).expand(3, 4, 4).sum()", _recorded(lambda: x.unsqueeze(0).expand(3, 4, 4).sum())),
            ("out.index_copy_(0, idx, x)", _recorded(lambda: torch.zeros(8, 4).index_copy_(0, torch.arange(4), x)))]


def _reference_launches(ops) -> tuple[int, int]:
    from rosellm_edu.benchmarks.launches import op_kind

    kinds = [op_kind(op) for op in ops]
    return kinds.count("kernel"), kinds.count("view")


@checker("count_launches")
def check_count_launches(fn) -> str:
    """fn(ops) -> (kernels, views) for a list of ATen operations."""
    cases = _launch_cases()
    for what, ops in cases:
        names = [str(op) for op in ops]
        expect_equal(tuple(fn(list(ops))), _reference_launches(ops), f"count_launches for {what}, ops {names}")
    return f"all {len(cases)} op lists counted right: views and allocations launch nothing, in-place ops do"
