# Generated from notebooks/03_continuous_batching.ipynb, notebooks/04_paged_attention.ipynb, notebooks/06_fast_sampling.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from rosellm_edu.sequence import Sequence


# notebooks/04_paged_attention.ipynb, cell 10
@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None          # set once the block is full and its K/V are computed
    token_ids: tuple[int, ...] = ()    # what the hash stands for, checked on a hit


# notebooks/04_paged_attention.ipynb, cell 10
def chain_hash(prev_hash: bytes | None, token_ids: tuple[int, ...]) -> bytes:
    """A block's key: its tokens and, through prev_hash, every token before them. SHA-256, so that no request can
    craft a prompt whose key collides with another's and be handed that request's K/V."""
    data = (prev_hash or b"") + np.array(token_ids, dtype=np.int64).tobytes()
    return hashlib.sha256(data).digest()


# notebooks/04_paged_attention.ipynb, cell 10
def share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


# notebooks/04_paged_attention.ipynb, cell 11
class BlockManager:
    """Fixed-size KV blocks handed out on demand, shared through reference counts, cached by prefix."""

    # notebooks/04_paged_attention.ipynb, cell 84
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size, self.enable_prefix_caching = block_size, enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # LRU first
        self.cached: dict[bytes, int] = {}                # hash -> block id, for free and used full blocks
        self.block_tables: dict[str, list[int]] = {}
        self.num_hashed: dict[str, int] = {}              # leading blocks of a sequence that have a hash
        self.queried_tokens = self.hit_tokens = 0                   # new requests' prompt tokens, and cache hits
        self.resumed_queried_tokens = self.resumed_hit_tokens = 0   # the same for preempted sequences readmitted
        self.copies: list[tuple[int, int]] = []           # (src, dst) blocks whose K/V to copy before the forward

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # notebooks/06_fast_sampling.ipynb, cell 93
    def prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks that hold the start of seq. The last token is never a hit: its logits are needed. Nor is any
        token of a sequence that still owes prompt logprobs: those need the logits of every prompt position (NEW)."""
        hits, prev = [], None
        owes = seq.prompt_logprobs is not None and len(seq.prompt_logprobs) < len(seq.prompt_token_ids)
        if self.enable_prefix_caching and not owes:
            ids = seq.token_ids
            for start in range(0, len(ids) - 1 - self.block_size + 1, self.block_size):
                tokens = tuple(ids[start:start + self.block_size])
                prev = chain_hash(prev, tokens)
                block_id = self.cached.get(prev)
                if block_id is None or self.blocks[block_id].token_ids != tokens:
                    break
                hits.append(block_id)
        return hits

    # notebooks/04_paged_attention.ipynb, cell 13
    def allocate(self, seq: Sequence, resumed: bool = False) -> int | None:
        """Give seq blocks for all its tokens; returns how many are cached already, or None if out of blocks.
        resumed: seq was preempted, so most hits are its own blocks, counted apart from the prefix hit rate."""
        hits = self.prefix_hits(seq)
        fresh = self.blocks_needed(len(seq)) - len(hits)
        if fresh + sum(self.blocks[b].ref_count == 0 for b in hits) > len(self.free_blocks):
            return None
        for b in hits:
            self._ref(b)
        self.block_tables[seq.request_id] = hits + [self._take_free() for _ in range(fresh)]
        self.num_hashed[seq.request_id] = len(hits)
        if resumed:
            self.resumed_queried_tokens += len(seq)
            self.resumed_hit_tokens += len(hits) * self.block_size
        else:
            self.queried_tokens += len(seq)
            self.hit_tokens += len(hits) * self.block_size
        return len(hits) * self.block_size

    # notebooks/04_paged_attention.ipynb, cell 85
    def ensure(self, seq: Sequence, num_computed: int, num_tokens: int) -> bool:
        """Grow seq's block table to hold num_tokens, and give seq its own copy of every shared block that positions
        num_computed onward write into; False (nothing changed) if the free blocks do not suffice."""
        table = self.block_tables[seq.request_id]
        first = num_computed // self.block_size
        shared = [i for i in range(first, len(table)) if self.blocks[table[i]].ref_count > 1]
        more = self.blocks_needed(num_tokens) - len(table)
        if more + len(shared) > len(self.free_blocks):                                    # copies need blocks
            return False
        for i in shared:                                                                   # copy-on-write
            table[i] = self.copy_on_write(table[i])
        table += [self._take_free() for _ in range(more)]
        return True

    # notebooks/04_paged_attention.ipynb, cell 15
    def commit(self, seq: Sequence, num_computed: int) -> None:
        """Hash the blocks that num_computed positions have filled, so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        table, ids = self.block_tables[seq.request_id], seq.token_ids
        done = self.num_hashed[seq.request_id]
        prev = self.blocks[table[done - 1]].hash if done else None
        for i in range(done, num_computed // self.block_size):
            block = self.blocks[table[i]]
            block.token_ids = tuple(ids[i * self.block_size:(i + 1) * self.block_size])
            block.hash = prev = chain_hash(prev, block.token_ids)
            self.cached.setdefault(prev, block.block_id)
        self.num_hashed[seq.request_id] = max(done, num_computed // self.block_size)

    # notebooks/04_paged_attention.ipynb, cell 15
    def free(self, request_id: str) -> None:
        """Drop a sequence's references. Unused blocks become free; those holding a prefix stay reusable."""
        self.num_hashed.pop(request_id, None)
        for b in reversed(self.block_tables.pop(request_id, [])):  # a prefix's tail is evicted before its head
            block = self.blocks[b]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_blocks[b] = None
                if self.cached.get(block.hash) != b:
                    self.free_blocks.move_to_end(b, last=False)           # worthless: reuse it first

    # notebooks/04_paged_attention.ipynb, cell 16
    def _ref(self, block_id: int) -> None:
        if self.blocks[block_id].ref_count == 0:
            del self.free_blocks[block_id]
        self.blocks[block_id].ref_count += 1

    # notebooks/04_paged_attention.ipynb, cell 16
    def _take_free(self) -> int:
        block_id, _ = self.free_blocks.popitem(last=False)                     # least recently used
        block = self.blocks[block_id]
        if self.cached.get(block.hash) == block_id:
            del self.cached[block.hash]
        block.hash, block.token_ids, block.ref_count = None, (), 1
        return block_id

    # notebooks/04_paged_attention.ipynb, cell 16
    def stats(self) -> dict:
        return {"total_blocks": len(self.blocks), "free_blocks": len(self.free_blocks),
                "cached_blocks": sum(self.cached.get(self.blocks[b].hash) == b for b in self.free_blocks),
                "prefix_hit_rate": share(self.hit_tokens, self.queried_tokens),
                "resumed_hit_rate": share(self.resumed_hit_tokens, self.resumed_queried_tokens)}

    # notebooks/04_paged_attention.ipynb, cell 84
    def fork(self, parent_id: str, child_id: str) -> None:
        """The child shares all the parent's blocks: the same table, one more reference on each block."""
        table = self.block_tables[parent_id]
        for b in table:
            self.blocks[b].ref_count += 1
        self.block_tables[child_id] = list(table)
        self.num_hashed[child_id] = self.num_hashed[parent_id]

    # notebooks/04_paged_attention.ipynb, cell 85
    def copy_on_write(self, src: int) -> int:
        """A private copy of shared block src: a free block, and a note to copy src's K/V into it."""
        dst = self._take_free()
        self.blocks[src].ref_count -= 1                     # others still use src: it stays where it is
        self.copies.append((src, dst))
        return dst

    # notebooks/04_paged_attention.ipynb, cell 85
    def take_copies(self) -> list[tuple[int, int]]:
        """The copies recorded since the last call, for the engine to make before its forward pass."""
        copies, self.copies = self.copies, []
        return copies
