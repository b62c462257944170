"""The `rosellm-edu` command.

    rosellm-edu serve --host 127.0.0.1 --port 8000 [--model DIR_OR_ID] [--quantization int4]   an OpenAI-compatible server
    rosellm-edu bench --engines openai --url http://127.0.0.1:8000/v1    the benchmark (see rosellm_edu.benchmarks.mixed)
"""

import argparse
import json
import os
import sys


def serve_args(argv: list[str]) -> argparse.Namespace:
    from rosellm_edu.entrypoints.openai.limits import ServerLimits
    from rosellm_edu.model_loader import QUANTIZATION_METHODS

    parser = argparse.ArgumentParser(prog="rosellm-edu serve", description="Serve the engine over OpenAI's API.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default=None, help="model directory or hub id (default: the embedded SmolLM2)")
    parser.add_argument("--served-model-name", default=None, help="the name clients use (default: --model)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="auto: bfloat16 on a GPU, and on a CPU whose bfloat16 matmuls beat float32")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when there is one)")
    parser.add_argument("--num-kv-blocks", type=int, default=None, help="default: as many as the budget holds")
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="the KV budget on a CPU")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--max-model-len", type=int, default=None, help="a shorter context than the model's")
    parser.add_argument("--quantization", default=None, choices=[m for m in QUANTIZATION_METHODS if m],
                        help="weight-only: int8 or int4 Linears, or the model's GGUF read as it ships (chapter 11)")
    parser.add_argument("--speculative-config", type=json.loads, default=None,
                        help='speculative decoding as JSON, as vLLM\'s flag: \'{"method": "ngram", '
                             '"num_speculative_tokens": 4, "prompt_lookup_max": 4}\'')
    parser.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
                        help="priority: requests with a lower `priority` field run first (vLLM's)")
    parser.add_argument("--max-grammar-bytes", type=int, default=65536,
                        help="the largest schema, regex or grammar a request may constrain its output with (chapter 13)")
    parser.add_argument("--generation-config", default="auto",
                        help="auto: the sampling defaults of the model's generation_config.json; vllm: ours; or a "
                             "directory holding a generation_config.json (vLLM's flag, appendix 13b)")
    parser.add_argument("--api-key", default=os.environ.get("ROSELLM_API_KEY"),
                        help="every /v1 route then needs `Authorization: Bearer KEY` (default: $ROSELLM_API_KEY; "
                             "/health, /metrics, /tokenize and /detokenize stay open)")
    limits = ServerLimits()
    parser.add_argument("--max-request-body-bytes", type=int, default=limits.max_body_bytes,
                        help="a larger request body is refused with 413 before it is parsed (default: 4 MiB)")
    parser.add_argument("--max-prompt-chars", type=int, default=limits.max_prompt_chars,
                        help="characters of a request's text (prompts or messages), checked before tokenizing")
    parser.add_argument("--max-n", type=int, default=limits.max_n, help="choices one request may ask for")
    parser.add_argument("--max-logit-bias", type=int, default=limits.max_logit_bias,
                        help="entries of a request's logit_bias")
    parser.add_argument("--tokenizer-workers", type=int, default=limits.tokenizer_workers,
                        help="threads tokenizing requests of ordinary size (large ones have a lane of their own)")
    parser.add_argument("--max-step-seconds", type=float, default=limits.max_step_seconds,
                        help="/health answers 503 while an engine step has run longer than this")
    parser.add_argument("--max-buffered-outputs", type=int, default=1024,
                        help="outputs a stream may hold unread; a client that stops reading past this is aborted")
    args = parser.parse_args(argv)
    if args.max_buffered_outputs < 1:
        parser.error(f"--max-buffered-outputs must be positive, got {args.max_buffered_outputs}")
    if args.max_grammar_bytes < 1:
        parser.error(f"--max-grammar-bytes must be positive, got {args.max_grammar_bytes}")
    return args


def server_limits(args: argparse.Namespace):
    from rosellm_edu.entrypoints.openai.limits import ServerLimits

    return ServerLimits(max_body_bytes=args.max_request_body_bytes, max_prompt_chars=args.max_prompt_chars,
                        max_n=args.max_n, max_logit_bias=args.max_logit_bias,
                        tokenizer_workers=args.tokenizer_workers, max_step_seconds=args.max_step_seconds)


def build_engine(args: argparse.Namespace):
    from rosellm_edu.engine.llm_engine import LLMEngine

    return LLMEngine(args.model, dtype=args.dtype, device=args.device, num_kv_blocks=args.num_kv_blocks,
                     kv_cache_memory_bytes=args.kv_cache_memory_bytes,
                     gpu_memory_utilization=args.gpu_memory_utilization, block_size=args.block_size,
                     max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                     enable_prefix_caching=not args.no_prefix_caching, max_model_len=args.max_model_len,
                     quantization=args.quantization, speculative_config=args.speculative_config,
                     scheduling_policy=args.scheduling_policy, max_grammar_bytes=args.max_grammar_bytes,
                     generation_config=args.generation_config)


def serve(argv: list[str]) -> None:
    args = serve_args(argv)

    import uvicorn

    from rosellm_edu.engine.async_llm_engine import AsyncLLMEngine
    from rosellm_edu.entrypoints.openai.api_server import build_app
    from rosellm_edu.model_loader import EMBEDDED_NAME

    limits = server_limits(args)   # refused here, before the model loads, if a limit is not positive
    engine = AsyncLLMEngine(build_engine(args), max_buffered_outputs=args.max_buffered_outputs)
    name = args.served_model_name or args.model or EMBEDDED_NAME
    print(f"serving {name!r} at http://{args.host}:{args.port}/v1"
          f"{' (a key required on /v1)' if args.api_key else ''}", flush=True)
    try:
        uvicorn.run(build_app(engine, name, api_key=args.api_key, limits=limits), host=args.host, port=args.port)
    finally:
        engine.shutdown()


def bench(argv: list[str]) -> None:
    from rosellm_edu.benchmarks.mixed import main

    main(argv)


COMMANDS = {"serve": serve, "bench": bench}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        sys.exit(__doc__.strip())
    COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
