"""What structured output costs, on the machine it runs on (chapter 13).

    python -m rosellm_edu.benchmarks.structured                  # writes notebooks/data/<machine>/structured.json
    python -m rosellm_edu.benchmarks.structured --out s.json --rounds 3

The embedded model in float32, three measurements:
- step: at batch 1, 8 and 64, every row constrained to a JSON schema that forces a long string (so no row finishes
  while it is timed), the median engine decode step and, of it, the bitmask's fill and apply
  (`StructuredOutputManager.apply_bitmask`, timed alone on the same rows);
- mixed: sixteen requests, a quarter of them constrained to their schema, against the same sixteen with no
  constraint: generated tokens per second, the median of `rounds` interleaved rounds after a warm-up;
- valid: the share of answers that parse and validate against their schema (jsonschema), with the schema asked
  for in the prompt only and with it constrained, on the same prompts and seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jsonschema
import torch

from rosellm_edu.benchmarks.machine import machine_line, record_dir
from rosellm_edu.llm import LLM
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.timing import median_time

SCHEMAS = {
    "person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name", "age"], "additionalProperties": False},
    "weather": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                 "celsius": {"type": "number"},
                                                 "sky": {"enum": ["sunny", "cloudy", "rainy"]}},
                "required": ["city", "celsius", "sky"], "additionalProperties": False},
    "answer": {"type": "object", "properties": {"answer": {"enum": ["A", "B", "C", "D"]}},
               "required": ["answer"], "additionalProperties": False},
}
QUESTIONS = {"person": "Describe a famous scientist.", "weather": "Report the weather in Paris today.",
             "answer": "Which planet is largest? A) Mars B) Jupiter C) Venus D) Earth"}
# a string of at least 600 characters: a constrained row that keeps decoding while steps are timed
STORY = {"type": "object", "properties": {"story": {"type": "string", "minLength": 600}}, "required": ["story"]}


def chat(tokenizer, question: str, schema: dict) -> str:
    """The question, asking for JSON that follows the schema, in the model's chat template."""
    ask = f"{question}\nAnswer with JSON only, following this JSON schema:\n{json.dumps(schema)}"
    return tokenizer.apply_chat_template([{"role": "user", "content": ask}], tokenize=False, add_generation_prompt=True)


def valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False


def step_cost(llm: LLM, batch: int) -> tuple[float, float]:
    """(seconds per engine decode step, seconds of it for the bitmask), `batch` constrained rows."""
    from rosellm_edu.sampling_params import StructuredOutputsParams   # chapter 13 reads SCHEMAS before defining it
    engine = llm.llm_engine
    prompt, story = chat(engine.tokenizer, "Write a long story.", {"type": "object"}), StructuredOutputsParams(json=STORY)
    for i in range(batch):
        engine.add_request(f"cost-{batch}-{i}", prompt,
                           SamplingParams(temperature=0.8, seed=i, max_tokens=400, structured_outputs=story))
    while len(engine.scheduler.running) < batch or any(len(s.output_token_ids) < 2 for s in engine.scheduler.running):
        engine.step()                                                    # prefill, then every row decodes
    seqs = list(engine.scheduler.running)
    logits = torch.randn(batch, engine.vocab_size)                       # (B, V)
    mask = median_time(lambda: engine.structured.apply_bitmask(logits, seqs, [[]] * batch), repeat=9)
    step = median_time(engine.step, repeat=5)
    engine.abort_request([s.request_id for s in seqs])
    return step, mask


def mixed_batch(llm: LLM, constrained: bool) -> tuple[list[str], list[SamplingParams]]:
    """Sixteen requests: four ask for JSON (constrained to their schema when `constrained`), twelve do not."""
    from rosellm_edu.sampling_params import StructuredOutputsParams
    names = list(SCHEMAS) * 2
    prompts = [chat(llm.llm_engine.tokenizer, QUESTIONS[n], SCHEMAS[n]) for n in names[:4]] + \
              [f"Tell me about topic {i}." for i in range(12)]
    params = [SamplingParams(temperature=0.7, seed=i, max_tokens=64, structured_outputs=(
        StructuredOutputsParams(json=SCHEMAS[names[i]]) if constrained and i < 4 else None)) for i in range(16)]
    return prompts, params


def throughput(llm: LLM, constrained: bool) -> float:
    prompts, params = mixed_batch(llm, constrained)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start)


def mixed_throughput(llm: LLM, rounds: int = 3) -> dict[str, float]:
    """Generated tokens/s, a quarter constrained and none: medians of interleaved rounds after a warm-up."""
    throughput(llm, True)
    runs = {"quarter_constrained": [], "unconstrained": []}
    for _ in range(rounds):                                              # interleaved, so drift hits both
        runs["quarter_constrained"].append(throughput(llm, True))
        runs["unconstrained"].append(throughput(llm, False))
    return {k: statistics.median(v) for k, v in runs.items()}


def valid_rates(llm: LLM, per_schema: int = 6) -> dict[str, float]:
    """The share of valid answers, asked in the prompt only and constrained, on the same prompts and seeds."""
    from rosellm_edu.sampling_params import StructuredOutputsParams
    cases = [(n, i) for n in SCHEMAS for i in range(per_schema)]
    prompts = [chat(llm.llm_engine.tokenizer, QUESTIONS[n], SCHEMAS[n]) for n, _ in cases]
    rates = {}
    for constrained in (False, True):
        params = [SamplingParams(temperature=0.7, seed=i, max_tokens=200, structured_outputs=(
            StructuredOutputsParams(json=SCHEMAS[n]) if constrained else None)) for n, i in cases]
        outs = llm.generate(prompts, params, use_tqdm=False)
        ok = [valid(o.outputs[0].text, SCHEMAS[n]) for o, (n, _) in zip(outs, cases)]
        rates["constrained" if constrained else "prompt_only"] = sum(ok) / len(ok)
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="default: notebooks/data/<machine>/structured.json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-sizes", default="1,8,64")
    args = parser.parse_args(argv)
    llm = LLM(dtype="float32")
    print(machine_line())
    steps = []
    for batch in map(int, args.batch_sizes.split(",")):
        step, mask = step_cost(llm, batch)
        steps.append({"batch": batch, "step_ms": step * 1e3, "bitmask_ms": mask * 1e3})
        print(f"batch {batch:3}: step {step * 1e3:8.2f} ms, bitmask {mask * 1e3:7.3f} ms ({mask / step:.2%})")
    mixed, rates = mixed_throughput(llm, args.rounds), valid_rates(llm)
    print(f"mixed batch: {mixed['quarter_constrained']:.1f} tokens/s a quarter constrained, "
          f"{mixed['unconstrained']:.1f} none; valid: {rates['prompt_only']:.0%} prompt only, "
          f"{rates['constrained']:.0%} constrained")
    out = args.out or record_dir() / "structured.json"
    record = {"machine": machine_line(), "dtype": "float32", "rounds": args.rounds, "steps": steps,
              "mixed_tokens_per_s": mixed, "valid": rates}
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
