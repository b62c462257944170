# Generated from notebooks/03_continuous_batching.ipynb, notebooks/04_paged_attention.ipynb, notebooks/04a_parallel_sampling.ipynb, notebooks/06a_logprobs.ipynb, notebooks/08_where_the_time_goes.ipynb, notebooks/12_speculative_decoding.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

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

    # notebooks/08_where_the_time_goes.ipynb, cell 37
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size, self.enable_prefix_caching = block_size, enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # LRU first
        self.cached: dict[bytes, int] = {}                # hash -> block id, for free and used full blocks
        self.block_tables: dict[str, list[int]] = {}
        self.table = BlockTable()                         # the same tables, as tensor rows
        self.num_hashed: dict[str, int] = {}              # leading blocks of a sequence that have a hash
        self.queried_tokens = self.hit_tokens = 0                   # new requests' prompt tokens, and cache hits
        self.resumed_queried_tokens = self.resumed_hit_tokens = 0   # the same for preempted sequences readmitted
        self.copies: list[tuple[int, int]] = []           # (src, dst) blocks whose K/V to copy before the forward

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # notebooks/06a_logprobs.ipynb, cell 38
    def prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks that hold the start of seq. The last token is never a hit: its logits are needed. Nor is any
        token of a sequence that still owes prompt logprobs: those need the logits of every prompt position."""
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

    # notebooks/08_where_the_time_goes.ipynb, cell 37
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
        self.table.write(seq.request_id, self.block_tables[seq.request_id])
        self.num_hashed[seq.request_id] = len(hits)
        if resumed:
            self.resumed_queried_tokens += len(seq)
            self.resumed_hit_tokens += len(hits) * self.block_size
        else:
            self.queried_tokens += len(seq)
            self.hit_tokens += len(hits) * self.block_size
        return len(hits) * self.block_size

    # notebooks/08_where_the_time_goes.ipynb, cell 38
    def ensure(self, seq: Sequence, num_computed: int, num_tokens: int) -> bool:
        """Grow seq's block table to hold num_tokens, and give seq its own copy of every shared block that positions
        num_computed onward write into; False (nothing changed) if the free blocks do not suffice."""
        table = self.block_tables[seq.request_id]
        first = num_computed // self.block_size
        shared = [i for i in range(first, len(table)) if self.blocks[table[i]].ref_count > 1]
        more = self.blocks_needed(num_tokens) - len(table)
        if more + len(shared) > len(self.free_blocks):                                    # copies need blocks
            return False
        changed = shared[0] if shared else len(table)                                      # first entry to rewrite
        for i in shared:                                                                   # copy-on-write
            table[i] = self.copy_on_write(table[i])
        table += [self._take_free() for _ in range(more)]
        self.table.write(seq.request_id, table, changed)                                   # only what changed
        return True

    # notebooks/08_where_the_time_goes.ipynb, cell 39
    def commit(self, seq: Sequence, num_computed: int) -> None:
        """Hash the blocks that num_computed positions have filled, so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        table, bs = self.block_tables[seq.request_id], self.block_size
        done = self.num_hashed[seq.request_id]
        prev = self.blocks[table[done - 1]].hash if done else None
        for i in range(done, num_computed // bs):
            block = self.blocks[table[i]]
            block.token_ids = tuple(seq.token_slice(i * bs, (i + 1) * bs))    # was seq.token_ids, every step
            block.hash = prev = chain_hash(prev, block.token_ids)
            self.cached.setdefault(prev, block.block_id)
        self.num_hashed[seq.request_id] = max(done, num_computed // bs)

    # notebooks/12_speculative_decoding.ipynb, cell 27
    def free(self, request_id: str) -> None:
        """Drop a sequence's references. Unused blocks become free; those holding a prefix stay reusable."""
        self.num_hashed.pop(request_id, None)
        self.table.drop(request_id)
        for b in reversed(self.block_tables.pop(request_id, [])):  # a prefix's tail is evicted before its head
            self.release(b)                                        # shared with trim

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

    # notebooks/08_where_the_time_goes.ipynb, cell 38
    def fork(self, parent_id: str, child_id: str) -> None:
        """The child shares all the parent's blocks: the same table, one more reference on each block."""
        table = self.block_tables[parent_id]
        for b in table:
            self.blocks[b].ref_count += 1
        self.block_tables[child_id] = list(table)
        self.table.write(child_id, table)
        self.num_hashed[child_id] = self.num_hashed[parent_id]

    # notebooks/04a_parallel_sampling.ipynb, cell 17
    def copy_on_write(self, src: int) -> int:
        """A private copy of shared block src: a free block, and a note to copy src's K/V into it."""
        dst = self._take_free()
        self.blocks[src].ref_count -= 1                     # others still use src: it stays where it is
        self.copies.append((src, dst))
        return dst

    # notebooks/04a_parallel_sampling.ipynb, cell 17
    def take_copies(self) -> list[tuple[int, int]]:
        """The copies recorded since the last call, for the engine to make before its forward pass."""
        copies, self.copies = self.copies, []
        return copies

    # notebooks/12_speculative_decoding.ipynb, cell 27
    def trim(self, request_id: str, num_tokens: int) -> None:
        """Give back the blocks of request_id's table past the first num_tokens tokens (rejected drafts' blocks)."""
        table = self.block_tables[request_id]
        keep = self.blocks_needed(num_tokens)
        for b in reversed(table[keep:]):
            self.release(b)
        del table[keep:]                       # the tensor row's stale tail is never read: widths follow the tokens

    # notebooks/12_speculative_decoding.ipynb, cell 27
    def release(self, block_id: int) -> None:
        """Drop one reference; an unused block becomes free, reused last if it holds a cached prefix, else first."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_blocks[block_id] = None
            if self.cached.get(block.hash) != block_id:
                self.free_blocks.move_to_end(block_id, last=False)


# notebooks/08_where_the_time_goes.ipynb, cell 34
class BlockTable:
    """Every sequence's block ids as rows of one int32 tensor, padded with block 0, kept in step with the block
    manager's lists: a row changes only where its list changed, and a step gathers its rows in one call."""

    def __init__(self, rows: int = 64, width: int = 32):
        self.ids = torch.zeros(rows, width, dtype=torch.int32)
        self.row: dict[str, int] = {}                    # request id -> its row
        self.free_rows = list(range(rows - 1, -1, -1))

    def write(self, request_id: str, table: list[int], start: int = 0) -> None:
        """Copy table[start:] into request_id's row, seating a new request in a free row."""
        if request_id not in self.row:
            if not self.free_rows:
                self.grow(2 * self.ids.shape[0], self.ids.shape[1])
            self.row[request_id] = self.free_rows.pop()
        if len(table) > self.ids.shape[1]:
            self.grow(self.ids.shape[0], max(2 * self.ids.shape[1], len(table)))
        if start < len(table):
            self.ids[self.row[request_id], start:len(table)] = torch.tensor(table[start:], dtype=torch.int32)

    def drop(self, request_id: str) -> None:
        row = self.row.pop(request_id, None)
        if row is not None:
            self.ids[row] = 0                             # the padding the next occupant expects
            self.free_rows.append(row)

    def rows(self, request_ids: list[str], width: int) -> torch.Tensor:
        """(len(request_ids), width) int32: the first `width` block ids of each, a copy."""
        index = torch.tensor([self.row[r] for r in request_ids], dtype=torch.long)
        return self.ids[:, :width].index_select(0, index)

    # notebooks/08_where_the_time_goes.ipynb, cell 35
    def grow(self, rows: int, width: int) -> None:
        """More rows (more sequences at once) or more columns (a longer sequence): a bigger tensor, the old one in its
        corner. Rare: the sizes double."""
        ids = torch.zeros(rows, width, dtype=torch.int32)
        ids[:self.ids.shape[0], :self.ids.shape[1]] = self.ids
        self.free_rows = list(range(rows - 1, self.ids.shape[0] - 1, -1)) + self.free_rows
        self.ids = ids
