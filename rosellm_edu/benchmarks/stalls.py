"""One request must not stall the others: each offending request, measured beside running streams.

    python -m rosellm_edu.benchmarks.stalls --before /tmp/before    # a checkout of the code to compare with
    python -m rosellm_edu.benchmarks.stalls --quick --scenarios echo_logprobs --out /tmp/stalls.json

For each scenario and each checkout (`--before`, e.g. a `git worktree` of an older commit, then this one), a fresh
`rosellm-edu serve` runs from that checkout (its directory first on the path), and 16 greedy streams of 128 tokens
(fixed token-id prompts, `ignore_eos`) run twice: alone (the baseline) and with the scenario's offending request
sent once every stream has a quarter of its tokens. Each run reports the worst inter-token gap of the streams, each
stream's total time, and, where the scenario has one, the latency of a 1-token request sent just after the
offender. Where a server refuses the full-size offender (a limit), its refusal (status
and message) is the result, and the largest offender it accepts (found by bisection on 1-token requests before the
streams start) is what runs beside them.

Scenarios:
- echo_logprobs: echo + logprobs over a 2,000-token prompt, max_tokens 1, as lm-evaluation-harness scores a
  document;
- logit_bias: a logit_bias over the whole vocabulary (or as much as the server accepts), 128 tokens;
- big_prompts: 8 prompts of text just under the 4 MiB body limit, then a 1-token request;
- n_large: n=64 x 256 tokens, then a 1-token request;
- n_large_priority: the same on a server run with `--scheduling-policy priority`, the n request at priority 1
  (vLLM's field: a lower value runs first), skipped on a checkout whose `serve --help` lacks the flag.
`--before-flags` and `--after-flags` add server flags (e.g. `--after-flags="--max-n 128"`). One JSON, written to
notebooks/data/<machine>/stalls.json unless --out says otherwise (--quick writes only where --out says). Timings
need an idle machine; `--quick` is a small version for tests.
"""

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import statistics
import string
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from datetime import datetime, timezone
from pathlib import Path
from typing import Awaitable, Callable

import httpx
import openai
import torch

from rosellm_edu import model_loader
from rosellm_edu.benchmarks.client import timed_request
from rosellm_edu.benchmarks.llama_cpp import Server, free_port, rosellm_server_command
from rosellm_edu.benchmarks.machine import describe, machine_record, record_dir
from rosellm_edu.benchmarks.metrics import RequestTimes

THIS_CHECKOUT = Path(__file__).resolve().parents[2]
PROBE_DELAY = 0.5   # seconds from the offender to the 1-token request: long enough for the offender to be queued


@dataclass(frozen=True)
class Size:
    """How large each piece of a run is: the full benchmark's, or --quick's for tests."""
    streams: int = 16
    stream_tokens: int = 128
    echo_prompt: int = 2000
    bias_tokens: int | None = None            # None: the whole vocabulary
    big_prompts: int = 8
    big_prompt_chars: int = 4 * 2**20 - 4096  # a body just under the default 4 MiB limit
    n: int = 64
    n_tokens: int = 256


FULL = Size()
QUICK = Size(streams=4, stream_tokens=12, echo_prompt=256, bias_tokens=2048, big_prompts=2, big_prompt_chars=2**16,
             n=8, n_tokens=16)


@dataclass
class Target:
    """A running server as the scenarios see it."""
    url: str            # .../v1
    http: httpx.AsyncClient
    model: str
    vocab_size: int


@dataclass
class Offense:
    """What a scenario sends while the streams run: its bodies, all at once; whether a 1-token request follows;
    what was sent (sizes); the server's refusal of the full-size offender, where it refused it."""
    bodies: list[dict]
    probe: bool = False
    sent: dict = field(default_factory=dict)
    refused: dict | None = None


async def post(target: Target, body: dict) -> dict:
    """POST /v1/completions: the status, the seconds it took, the error's message where there is one (status None:
    no answer, the connection failed)."""
    start = time.perf_counter()
    try:
        r = await target.http.post(f"{target.url}/completions", json={"model": target.model, **body})
    except httpx.TransportError as e:
        return {"status": None, "seconds": time.perf_counter() - start, "error": repr(e)}
    answer = {"status": r.status_code, "seconds": time.perf_counter() - start}
    if r.status_code != 200:
        try:
            answer["error"] = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            answer["error"] = r.text[:500]
    return answer


async def largest_accepted(target: Target, body_of: Callable[[int], dict], full: int) -> tuple[int, dict | None]:
    """`full` if the server accepts body_of(full); otherwise the largest size it accepts (bisection, each try a
    1-token request) and its refusal of the full size."""
    refusal = await post(target, {**body_of(full), "max_tokens": 1})
    if refusal["status"] == 200:
        return full, None
    accepted, refused = 0, full
    while refused - accepted > 1:
        mid = (accepted + refused) // 2
        if (await post(target, {**body_of(mid), "max_tokens": 1}))["status"] == 200:
            accepted = mid
        else:
            refused = mid
    return accepted, {key: refusal[key] for key in ("status", "error")}


def token_ids(count: int, vocab_size: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, vocab_size) for _ in range(count)]


# The scenarios: each builds its offender for one server.

async def echo_logprobs(target: Target, size: Size) -> Offense:
    """lm-evaluation-harness' loglikelihood request: the whole document echoed with its logprobs, 1 token."""
    body = {"prompt": token_ids(size.echo_prompt, target.vocab_size, seed=1), "max_tokens": 1, "echo": True,
            "logprobs": 1, "temperature": 0}
    return Offense([body], sent={"prompt_tokens": size.echo_prompt})


async def logit_bias(target: Target, size: Size) -> Offense:
    """A logit_bias over the whole vocabulary (or the most entries the server accepts), beside the streams."""
    def body_of(entries: int) -> dict:
        return {"prompt": token_ids(128, target.vocab_size, seed=2), "max_tokens": size.stream_tokens,
                "temperature": 0, "ignore_eos": True, "logit_bias": {str(t): 1.0 for t in range(entries)}}

    entries, refused = await largest_accepted(target, body_of, size.bias_tokens or target.vocab_size)
    return Offense([body_of(entries)], sent={"logit_bias_entries": entries}, refused=refused)


async def big_prompts(target: Target, size: Size) -> Offense:
    """Prompts of text just under the body limit, each tokenized by the server, then a 1-token request."""
    rng = random.Random(3)   # letters and spaces: words the tokenizer has not cached
    text = "".join(rng.choices(string.ascii_lowercase + " " * 5, k=size.big_prompt_chars))
    return Offense([{"prompt": text, "max_tokens": 1} for _ in range(size.big_prompts)], probe=True,
                   sent={"prompts": size.big_prompts, "prompt_chars": size.big_prompt_chars})


async def n_large(target: Target, size: Size, priority: int | None = None) -> Offense:
    """One request for n samples of n_tokens each (or the largest n the server accepts), then a 1-token request."""
    def body_of(n: int) -> dict:
        return {"prompt": "Once upon a time", "n": n, "max_tokens": size.n_tokens, "temperature": 1.0, "seed": 0,
                "ignore_eos": True, **({} if priority is None else {"priority": priority})}

    n, refused = await largest_accepted(target, body_of, size.n)
    return Offense([body_of(n)], probe=True, sent={"n": n, "max_tokens": size.n_tokens, "priority": priority},
                   refused=refused)


async def n_large_priority(target: Target, size: Size) -> Offense:
    """n_large on a server with priority scheduling, the n request at priority 1: after the others' 0."""
    return await n_large(target, size, priority=1)


# name -> (scenario, the server flags it needs: skipped on a checkout without them)
SCENARIOS: dict[str, tuple[Callable[[Target, Size], Awaitable[Offense]], list[str]]] = {
    "echo_logprobs": (echo_logprobs, []),
    "logit_bias": (logit_bias, []),
    "big_prompts": (big_prompts, []),
    "n_large": (n_large, []),
    "n_large_priority": (n_large_priority, ["--scheduling-policy", "priority"]),
}


async def beside(target: Target, size: Size, offense: Offense | None,
                 probe: bool) -> tuple[list[RequestTimes], list[str], list[dict], dict | None]:
    """The streams; once each has a quarter of its tokens, the offense's bodies (None: none, the baseline), and
    PROBE_DELAY later a 1-token request where `probe`. Each stream's token times (seconds from the start), the
    streams' errors, the offender's answers and the 1-token request's, each with the time it was sent."""
    prompts = [token_ids(128, target.vocab_size, seed=100 + i) for i in range(size.streams)]
    records = [RequestTimes(0.0, prompt_tokens=len(p)) for p in prompts]
    sampling = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
    start = time.perf_counter()

    async def after_a_quarter(delay: float, body: dict) -> dict:
        while not all(len(r.token_times) >= size.stream_tokens // 4 or t.done() for r, t in zip(records, streams)):
            await asyncio.sleep(0.01)   # a stream that failed early does not hold the offender back
        await asyncio.sleep(delay)
        return {"sent_at_s": time.perf_counter() - start, **await post(target, body)}

    async with openai.AsyncOpenAI(base_url=target.url, api_key="EMPTY", max_retries=0, timeout=600) as client:
        streams = [asyncio.ensure_future(timed_request(client, target.model, p, size.stream_tokens, 0.0, start,
                                                       sampling, times=r)) for p, r in zip(prompts, records)]
        offender = [after_a_quarter(0.0, body) for body in (offense.bodies if offense else [])]
        probes = [after_a_quarter(PROBE_DELAY, {"prompt": "Hi", "max_tokens": 1, "temperature": 0})] if probe else []
        results = await asyncio.gather(*streams, *offender, *probes, return_exceptions=True)
    answers = [{"error": repr(r)} if isinstance(r, BaseException) else r for r in results[len(streams):]]
    errors = [repr(r) for r in results[:len(streams)] if isinstance(r, BaseException)]
    return records, errors, answers[:len(offender)], answers[-1] if probe else None


def worst_gap(records: list[RequestTimes]) -> float | None:
    """The longest wait between two tokens of any stream."""
    return max((gap for r in records for gap in r.itl), default=None)


async def run(target: Target, size: Size, offense: Offense | None, probe: bool) -> dict:
    """`beside`'s run, summarized: the worst gap, each stream's seconds, the answers."""
    records, errors, offender, probe_answer = await beside(target, size, offense, probe)
    return {"worst_gap_s": worst_gap(records),
            "stream_seconds": [r.e2e if r.token_times else None for r in records],
            "streams_finished": sum(len(r.token_times) == size.stream_tokens for r in records),
            "stream_errors": errors, "offender": offender, "probe": probe_answer}


@cache
def server_flags(checkout: Path) -> frozenset[str]:
    """The flags `serve --help` of that checkout lists."""
    done = subprocess.run([sys.executable, "-m", "rosellm_edu.entrypoints.cli", "serve", "--help"], cwd=checkout,
                          env=checkout_env(checkout), capture_output=True, text=True, check=True)
    return frozenset(re.findall(r"--[a-z][a-z0-9-]*", done.stdout))


def checkout_env(checkout: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1"}


async def scenario_on(checkout: Path, name: str, size: Size, args, extra_flags: list[str]) -> dict:
    """One scenario on a fresh server of one checkout: warm-up, then the baseline and the run with the offender."""
    scenario, needed = SCENARIOS[name]
    known = server_flags(checkout)
    if missing := [f for f in needed if f.startswith("--") and f not in known]:
        return {"skipped": f"this checkout's serve has no {', '.join(missing)}"}
    port = free_port()
    command = [*rosellm_server_command(args.dtype, port, args.max_num_seqs, args.max_num_batched_tokens),
               *needed, *extra_flags]
    with Server(command, port, args.threads, env=checkout_env(checkout), cwd=checkout) as url:
        async with httpx.AsyncClient(timeout=600) as http:
            model = (await http.get(f"{url}/models")).json()["data"][0]["id"]
            target = Target(url, http, model, args.vocab_size)
            await run(target, replace(size, stream_tokens=4), None, probe=False)   # a warm-up
            offense = await scenario(target, size)
            baseline = await run(target, size, None, offense.probe)
            offended = await run(target, size, offense, offense.probe)
    return {"command": command, "sent": offense.sent, "refused": offense.refused,
            "baseline": baseline, "with_offender": offended}


def commit_of(checkout: Path) -> str:
    done = subprocess.run(["git", "-C", str(checkout), "describe", "--always", "--dirty"], capture_output=True,
                          text=True)
    return done.stdout.strip() or "unknown"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(scenarios: dict) -> str:
    lines = [f"{'scenario':>17} {'checkout':>8} {'worst gap s':>15} {'median stream s':>15} {'1-token s':>11}  refused"]
    for name, sides in scenarios.items():
        for side, r in sides["checkouts"].items():
            if "skipped" in r:
                lines.append(f"{name:>17} {side:>8}  skipped: {r['skipped']}")
                continue
            alone, beside = r["baseline"], r["with_offender"]
            median = [seconds(statistics.median(s for s in x["stream_seconds"] if s is not None))
                      for x in (alone, beside)]
            probes = [seconds(x["probe"].get("seconds")) if x["probe"] else "-" for x in (alone, beside)]
            refused = f"{r['refused']['status']} {r['refused']['error'][:60]}" if r["refused"] else ""
            lines.append(f"{name:>17} {side:>8} {seconds(alone['worst_gap_s']):>7}/{seconds(beside['worst_gap_s']):<7} "
                         f"{median[0]:>7}/{median[1]:<7} {probes[0]:>5}/{probes[1]:<5}  {refused}")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rosellm_edu.benchmarks.stalls",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, default=None, help="an older checkout to measure first")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    parser.add_argument("--quick", action="store_true", help="small sizes, for tests; no numbers to keep")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None, help="the servers' threads (default: torch's)")
    parser.add_argument("--before-flags", default="", help="more flags for the --before servers")
    parser.add_argument("--after-flags", default="", help="more flags for this checkout's servers")
    parser.add_argument("--out", type=Path, default=None, help="default: notebooks/data/<machine>/stalls.json")
    args = parser.parse_args(argv)
    args.scenarios = args.scenarios.split(",")
    if bad := [s for s in args.scenarios if s not in SCENARIOS]:
        parser.error(f"--scenarios: unknown {', '.join(map(repr, bad))}; choose from {', '.join(SCENARIOS)}")
    args.threads = args.threads or torch.get_num_threads()
    return args


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    size = QUICK if args.quick else FULL
    args.vocab_size = model_loader.load_config(model_loader.resolve_model(None)).vocab_size
    checkouts = {"after": (THIS_CHECKOUT, shlex.split(args.after_flags))}
    if args.before:
        checkouts = {"before": (args.before.resolve(), shlex.split(args.before_flags)), **checkouts}
    scenarios = {}
    for name in args.scenarios:
        print(f"{name}: {SCENARIOS[name][0].__doc__}", flush=True)
        scenarios[name] = {"what": SCENARIOS[name][0].__doc__, "checkouts": {
            side: asyncio.run(scenario_on(path, name, size, args, flags)) for side, (path, flags) in checkouts.items()}}
    report = {"machine": machine_record(), "describe": describe(), "threads": args.threads,
              "torch": torch.__version__, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python -m rosellm_edu.benchmarks.stalls", *argv]), "size": asdict(size),
              "checkouts": {side: {"path": str(path), "commit": commit_of(path)}
                            for side, (path, _) in checkouts.items()},
              "scenarios": scenarios}
    print(table(scenarios))
    out = args.out or (None if args.quick else record_dir() / "stalls.json")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
