# Generated from notebooks/00_the_model.ipynb, notebooks/02_kv_cache.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


# notebooks/00_the_model.ipynb, cell 15
def median_time(fn, repeat: int = 7, warmup: int = 1) -> float:
    """Seconds per call of fn(): the median of `repeat` timed calls after `warmup` untimed ones (the first call
    pays for caches, allocations and lazy set-up that later calls do not)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# notebooks/00_the_model.ipynb, cell 15
def verdict(name: str, seconds: float, baseline: str, baseline_seconds: float, noise: float = 0.05) -> str:
    """'A takes 1.26x the time of B: slower on this machine', computed from the two times. Within `noise` of
    each other the two are called even: a run-to-run wobble is not a result."""
    ratio = seconds / baseline_seconds
    word = "faster" if ratio < 1 - noise else "slower" if ratio > 1 + noise else "within noise"
    return f"{name} takes {ratio:.2f}x the time of {baseline}: {word} on this machine"


# notebooks/02_kv_cache.ipynb, cell 28
@dataclass(frozen=True)
class Choice:
    """What a measurement chose: the winner and each candidate's seconds per call."""
    name: str
    seconds: dict[str, float]

    def __str__(self) -> str:
        times = ", ".join(f"{name} {s * 1e3:.3f} ms" for name, s in self.seconds.items())
        return f"chosen on this machine: {self.name} ({times})"


# notebooks/02_kv_cache.ipynb, cell 28
CHOICES: dict[str, Choice] = {}   # one measurement per key and process


# notebooks/02_kv_cache.ipynb, cell 28
def choose(key: str, candidates: dict[str, Callable[[], object]], repeat: int = 7, warmup: int = 2,
           noise: float = 0.05) -> Choice:
    """Time each candidate, in interleaved rounds after a warm-up, and keep the fastest, once per process. The
    first candidate is the default: another replaces it only when faster by more than `noise`."""
    if key not in CHOICES:
        for fn in candidates.values():
            for _ in range(warmup):
                fn()
        rounds = {name: [] for name in candidates}
        for _ in range(repeat):   # interleaved, so a slow moment of the machine hits every candidate alike
            for name, fn in candidates.items():
                rounds[name].append(median_time(fn, repeat=1, warmup=0))
        seconds = {name: statistics.median(times) for name, times in rounds.items()}
        default, best = next(iter(seconds)), min(seconds, key=seconds.get)
        CHOICES[key] = Choice(best if seconds[best] < (1 - noise) * seconds[default] else default, seconds)
    return CHOICES[key]
