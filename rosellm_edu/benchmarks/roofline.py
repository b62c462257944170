# Generated from notebooks/08_where_the_time_goes.ipynb, notebooks/11_weight_only_quantization.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from dataclasses import dataclass

import torch

from rosellm_edu.huge_pages import empty_on_huge_pages
from rosellm_edu.timing import median_time


# notebooks/08_where_the_time_goes.ipynb, cell 12
def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# notebooks/08_where_the_time_goes.ipynb, cell 12
def device_time(fn, device: torch.device, repeat: int = 5) -> float:
    """Seconds per call of fn(): timing.median_time of `repeat` calls after a warm-up, each waited for on a GPU."""
    def synced():
        fn()
        _synchronize(device)
    return median_time(synced, repeat=repeat, warmup=1)


# notebooks/08_where_the_time_goes.ipynb, cell 13
def memory_bandwidth(num_bytes: int = 256 * 2**20, device: str | torch.device = "cpu", repeat: int = 5) -> float:
    """Bytes per second this device's memory moves: a copy of a tensor far larger than any cache reads each
    byte once and writes it once."""
    device = torch.device(device)
    src = torch.ones(num_bytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * num_bytes / device_time(lambda: dst.copy_(src), device, repeat)


# notebooks/08_where_the_time_goes.ipynb, cell 13
def matmul_throughput(shapes: list[tuple[int, int, int]], dtype: torch.dtype, device: str | torch.device = "cpu",
                      repeat: int = 3) -> float:
    """FLOP/s of the fastest of the (rows, in, out) matmuls: x (rows, in) @ w (in, out) costs 2·rows·in·out."""
    device = torch.device(device)
    best = 0.0
    for rows, d_in, d_out in shapes:
        x, w = torch.randn(rows, d_in, dtype=dtype, device=device), torch.randn(d_in, d_out, dtype=dtype, device=device)
        best = max(best, 2 * rows * d_in * d_out / device_time(lambda: x @ w, device, repeat))
    return best


# notebooks/08_where_the_time_goes.ipynb, cell 14
@dataclass
class ModelCost:
    """What one forward step of a decoder must compute and move, counted from the model itself."""
    layers: int
    heads: int
    head_dim: int
    layer_weights: int        # weights of the decoder layers' matmuls (biases included)
    head_weights: int         # the LM head, vocab × hidden: it runs on the sampling rows only
    weight_bytes: int         # every weight a step reads once (embedding tables only where they are the LM head)
    kv_bytes_per_token: int   # K and V of one position, all layers

    @classmethod
    def of(cls, model) -> "ModelCost":
        config = model.config
        layers = next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList))   # the decoder layers
        linears = [m for m in layers.modules() if isinstance(m, torch.nn.Linear)]
        head = lm_head_weight(model)
        tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)} - {id(head)}
        size = head.element_size()
        heads = getattr(config, "num_attention_heads", None) or config.n_head
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or (getattr(config, "hidden_size", None) or config.n_embd) // heads
        return cls(layers=len(layers), heads=heads, head_dim=head_dim,
                   layer_weights=sum(p.numel() for m in linears for p in m.parameters()),
                   head_weights=head.numel(),
                   weight_bytes=size * sum(p.numel() for p in model.parameters() if id(p) not in tables),
                   kv_bytes_per_token=2 * len(layers) * kv_heads * head_dim * size)

    # notebooks/08_where_the_time_goes.ipynb, cell 15
    def step_flops(self, num_computed: list[int], num_new: list[int], sampling_rows: int | None = None) -> int:
        """FLOPs of one step in which sequence i has num_computed[i] positions cached and computes num_new[i] more:
        2 per weight per token, the LM head on the sampling rows (default: one per sequence), and attention's
        4·head_dim per query head, per layer, per (query, visible key) pair."""
        tokens = sum(num_new)
        rows = len(num_new) if sampling_rows is None else sampling_rows
        pairs = sum(n * c + n * (n + 1) // 2 for c, n in zip(num_computed, num_new))   # query j sees c + j + 1 keys
        return 2 * self.layer_weights * tokens + 2 * self.head_weights * rows + 4 * self.layers * self.heads * self.head_dim * pairs

    # notebooks/08_where_the_time_goes.ipynb, cell 15
    def step_bytes(self, num_computed: list[int], num_new: list[int]) -> int:
        """Bytes one step must move at the least: every weight once, each sequence's K/V once (the new positions
        written, then all read). Activations are left out: they are small beside the weights unless a chunk is long."""
        kv_read = sum(c + n for c, n in zip(num_computed, num_new))
        return self.weight_bytes + self.kv_bytes_per_token * (kv_read + sum(num_new))

    # notebooks/08_where_the_time_goes.ipynb, cell 15
    def step_floor(self, num_computed: list[int], num_new: list[int], flops_per_s: float, bytes_per_s: float) -> float:
        """The least time the step can take on a machine that computes flops_per_s and moves bytes_per_s: the
        slower of the two, each running at its ceiling (the roofline)."""
        return max(self.step_flops(num_computed, num_new) / flops_per_s, self.step_bytes(num_computed, num_new) / bytes_per_s)


# notebooks/08_where_the_time_goes.ipynb, cell 15
def matmul_shapes(model, rows: int) -> list[tuple[int, int, int]]:
    """(rows, in, out) of the model's own matmuls: one decoder layer's and the LM head's."""
    layer = next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList))[0]
    shapes = {(rows, m.in_features, m.out_features) for m in layer.modules() if isinstance(m, torch.nn.Linear)}
    vocab, hidden = lm_head_weight(model).shape
    return sorted(shapes | {(rows, hidden, vocab)})


# notebooks/08_where_the_time_goes.ipynb, cell 15
def lm_head_weight(model) -> torch.Tensor:
    """(vocab, hidden): the LM head's own weight, or the token embedding it is tied to (GPT-2 has no lm_head)."""
    head = getattr(model, "lm_head", None)
    return head.weight if head is not None else model.wte.weight


# notebooks/11_weight_only_quantization.ipynb, cell 77
def memory_read_bandwidth(num_bytes: int = 256 * 2**20, device: str | torch.device = "cpu", repeat: int = 5) -> float:
    """Bytes per second this device reads: a sum over a tensor far larger than any cache reads each byte once and
    writes nothing, as a decode step reads its weights (a copy, chapter 08's memory_bandwidth, writes too). On a
    CPU the tensor lies on huge pages where Linux grants them, as load_model puts the weights (chapter 10). Its
    values are random, as weights are: one CPU read huge pages of ones at twice the rate of random values."""
    device = torch.device(device)
    huge = empty_on_huge_pages(num_bytes) if device.type == "cpu" else None
    src = (torch.empty(num_bytes // 4, device=device) if huge is None else huge.view(torch.float32)).uniform_()
    return num_bytes / device_time(lambda: src.sum(), device, repeat)
