"""torch.compile of chapter 10's add + RMSNorm, measured in a process of its own:

    python -m rosellm_edu.benchmarks.compile_pointwise

Compiles kernels.cpu_fused.add_rms_norm_reference with dynamic=True against an empty inductor cache (what CI or a
new machine pays), calls it at other token counts and counts the graphs compiled, compiles it again with the cache
warm, then times eager against compiled at 64 and 1024 rows (float32). Chapter 10 runs it in a subprocess: the
compiled code's OpenMP threads, left spinning after each call, would otherwise slow every later timing of the
notebook, and the empty cache stays private to this run.
"""

import os
import tempfile
import time


def main() -> None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()     # before torch is imported: an empty cache
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from rosellm_edu.kernels.cpu_fused import add_rms_norm_reference
    from rosellm_edu.timing import median_time, verdict

    hidden, eps = 576, 1e-5
    weight = torch.rand(hidden) + 0.5
    rows = {n: (torch.randn(n, hidden), torch.randn(n, hidden)) for n in (64, 1, 7, 1024)}
    compiled = torch.compile(add_rms_norm_reference, dynamic=True)
    start = time.perf_counter()
    compiled(*rows[64], weight, eps)
    cold = time.perf_counter() - start
    for n in (1, 7, 1024):
        compiled(*rows[n], weight, eps)                 # a new token count: a recompile would show in the count
    graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()                                # forget the compiled code, keep the cache on disk
    compiled = torch.compile(add_rms_norm_reference, dynamic=True)
    start = time.perf_counter()
    compiled(*rows[64], weight, eps)
    warm = time.perf_counter() - start
    print(f"compile, empty cache: {cold:.1f} s; compile again, warm cache: {warm:.2f} s")
    print(f"graphs compiled for 4 token counts with dynamic=True: {graphs}")
    for n in (64, 1024):
        x, r = rows[n]
        eager = median_time(lambda: add_rms_norm_reference(x, r, weight, eps), repeat=20)
        fast = median_time(lambda: compiled(x, r, weight, eps), repeat=20)
        print(f"add + RMSNorm, {n:4d} x {hidden}, float32: eager {1e3 * eager:.3f} ms, compiled {1e3 * fast:.3f} ms; "
              + verdict("compiled", fast, "eager", eager))

if __name__ == "__main__":
    main()
