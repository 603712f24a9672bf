"""A model server's scheduler as a router sees it, simulated; pure (no clock, no I/O).

One `Engine` is one replica: a paged KV cache of `kv_blocks` blocks of `block_tokens` tokens, a
prefix cache over those blocks (chained block hashes; a freed block keeps its hash and is evicted
least recently used first, as vLLM's is), a waiting queue and a continuously batched running set.
Each `step()` is one forward pass, as vLLM V1 schedules it:

- every running request decodes one token; one that needs a new block when none is free preempts
  the newest running request (its blocks are freed, it goes back to the front of the queue and
  recomputes when readmitted: vLLM's recompute preemption, counted in `preemptions`);
- waiting requests are admitted in order while the batch has room (`max_running`) and the KV cache
  can hold their prompt; a prompt's leading blocks already cached are hits and need no prefill;
- prefill runs in chunks of at most `prefill_budget` tokens per step, shared by the admitted ones;
  a request's first token comes out of the step that finishes its prefill.

The step lasts `decode_base_ms + decode_ms_per_seq * decoding + prefill_ms_per_token * prefilled`:
decode time grows with the batch, prefill with the uncached prompt. The shell (server.py) sleeps
that long and then hands the step's tokens to the callers.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class EngineSpec:
    kv_blocks: int = 1024
    block_tokens: int = 16
    max_running: int = 64  # vLLM's max_num_seqs
    prefill_budget: int = 2048  # tokens prefilled per step at most (chunked prefill)
    decode_base_ms: float = 8.0
    decode_ms_per_seq: float = 0.3
    prefill_ms_per_token: float = 0.08

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_tokens


@dataclass(eq=False, slots=True)
class SimRequest:
    """One call: its prompt as chained block hashes plus a tail of tokens in no full block."""

    rid: str
    block_hashes: tuple[int, ...]
    prompt_tokens: int
    max_tokens: int
    generated: int = 0
    prefilled: int = 0  # prompt (+ generated, after a preemption) tokens computed so far
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at the last admission
    blocks: list[int] = field(default_factory=list)
    preempted: int = 0

    @property
    def context(self) -> int:
        """Tokens whose KV must be held: the prompt and what was generated."""
        return self.prompt_tokens + self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.max_tokens


@dataclass(frozen=True, slots=True)
class StepOut:
    """One step: how long it took and who got a token (first tokens listed apart)."""

    duration_ms: float
    tokens: tuple[SimRequest, ...]
    first: tuple[SimRequest, ...]
    finished: tuple[SimRequest, ...]
    prefill_tokens: int


def chain_hashes(tokens: list[int] | tuple[int, ...] | str, block: int) -> tuple[int, ...]:
    """One hash per full block, each covering every block before it (a prefix's identity)."""
    out: list[int] = []
    h = 0
    for i in range(len(tokens) // block):
        h = hash((h, tokens[i * block:(i + 1) * block] if isinstance(tokens, str) else
                  tuple(tokens[i * block:(i + 1) * block])))
        out.append(h)
    return tuple(out)


class Engine:
    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self._clear()

    def _clear(self) -> None:
        spec = self.spec
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._free: list[int] = list(range(spec.kv_blocks - 1, -1, -1))  # blocks holding nothing
        self._ref = [0] * spec.kv_blocks
        self._hash_of: dict[int, int] = {}  # block -> its prefix hash, while it has one
        self._block_of: dict[int, int] = {}  # prefix hash -> block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached blocks with no user, LRU first
        # counters, as vLLM exports them
        self.preemptions = 0
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # of which were cached
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished = 0

    # -- what /metrics reports -----------------------------------------------------------
    @property
    def kv_usage(self) -> float:
        """Blocks some running request holds, as a fraction (cached-but-free blocks are not use)."""
        used = self.spec.kv_blocks - len(self._free) - len(self._evictable)
        return used / self.spec.kv_blocks

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # -- calls ---------------------------------------------------------------------------
    def submit(self, req: SimRequest) -> None:
        self.waiting.append(req)

    def cancel(self, req: SimRequest) -> None:
        """The caller went away: drop it wherever it is."""
        if req in self.running:
            self.running.remove(req)
            self._release(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    def reset(self) -> None:
        """An empty cache and zeroed counters (between benchmark rounds); only while idle."""
        assert self.idle, "reset with calls in flight"
        self._clear()

    # -- one forward pass ------------------------------------------------------------------
    def step(self) -> StepOut:
        s = self.spec
        tokens: list[SimRequest] = []
        # 1. decode: every request whose prefill is done makes one token, needing a block at a boundary
        decoding = [r for r in self.running if r.prefilled >= r.context]
        for r in decoding:
            if r.prefilled < r.context:
                continue  # preempted by an earlier one in this loop (its prefill starts over)
            if len(r.blocks) * s.block_tokens <= r.context and not self._grow(r):
                continue  # preempted itself: no block anywhere
            r.generated += 1
            r.prefilled += 1
            tokens.append(r)
        n_decoding = len(tokens)
        # 2. admit waiting requests while the batch and the cache have room
        while self.waiting and len(self.running) < s.max_running:
            if not self._admit(self.waiting[0]):
                break
            self.running.append(self.waiting.popleft())
        # 3. prefill, in order, within the step's token budget
        budget = s.prefill_budget
        first: list[SimRequest] = []
        prefilled = 0
        for r in self.running:
            if budget <= 0:
                break
            need = r.context - r.prefilled
            if need <= 0:
                continue
            n = min(need, budget)
            r.prefilled += n
            budget -= n
            prefilled += n
            if r.prefilled >= r.context and r.generated == 0:
                r.generated = 1  # the prefill's forward pass yields the first token
                r.prefilled += 1
                first.append(r)
                tokens.append(r)
        duration = s.decode_base_ms + s.decode_ms_per_seq * n_decoding + s.prefill_ms_per_token * prefilled
        finished = [r for r in tokens if r.done]
        for r in finished:
            self.running.remove(r)
            self._release(r)
        self.generation_tokens += len(tokens)
        self.finished += len(finished)
        return StepOut(duration if (tokens or prefilled) else 0.0, tuple(tokens), tuple(first), tuple(finished),
                       prefilled)

    # -- the KV cache ------------------------------------------------------------------------
    def _blocks_needed(self, tokens: int) -> int:
        return -(-tokens // self.spec.block_tokens)

    def _available(self) -> int:
        return len(self._free) + len(self._evictable)

    def _take(self) -> int | None:
        if self._free:
            return self._free.pop()
        if self._evictable:
            b, _ = self._evictable.popitem(last=False)
            del self._block_of[self._hash_of.pop(b)]
            return b
        return None

    def _admit(self, r: SimRequest) -> bool:
        """Hold the request's prompt blocks (cached ones shared), or False with nothing changed."""
        hits: list[int] = []
        for h in r.block_hashes:
            b = self._block_of.get(h)
            if b is None:
                break
            hits.append(b)
        # a fully cached prompt still computes its last token (as vLLM does): the last hit is left out
        if hits and len(hits) * self.spec.block_tokens >= r.context:
            hits.pop()
        need = self._blocks_needed(r.context + 1) - len(hits)
        revived = sum(1 for b in hits if self._ref[b] == 0)  # hits that were evictable count against room
        if need > self._available() - revived:
            return False
        for b in hits:
            if self._ref[b] == 0:
                del self._evictable[b]
            self._ref[b] += 1
        r.blocks = list(hits)
        for _ in range(need):
            b = self._take()
            assert b is not None
            self._ref[b] = 1
            r.blocks.append(b)
        # The prompt's fresh full blocks get their hashes now (vLLM caches them as they fill).
        for i in range(len(hits), min(len(r.block_hashes), len(r.blocks))):
            h = r.block_hashes[i]
            if h not in self._block_of:
                self._block_of[h] = r.blocks[i]
                self._hash_of[r.blocks[i]] = h
        cached = len(hits) * self.spec.block_tokens
        r.prefilled = cached
        if r.generated == 0:  # a recompute after preemption is not a new query
            self.prefix_queries += r.prompt_tokens
            self.prefix_hits += cached
            self.prompt_tokens += r.prompt_tokens
            r.cached_tokens = cached
        return True

    def _grow(self, r: SimRequest) -> bool:
        """One more block for `r`, preempting the newest running requests for it; False: `r` itself went."""
        while True:
            b = self._take()
            if b is not None:
                self._ref[b] = 1
                r.blocks.append(b)
                return True
            victim = self.running[-1]
            self.running.pop()
            self._release(victim)
            victim.prefilled = 0
            victim.preempted += 1
            self.preemptions += 1
            self.waiting.appendleft(victim)
            if victim is r:
                return False

    def _release(self, r: SimRequest) -> None:
        for b in r.blocks:
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if b in self._hash_of:
                    self._evictable[b] = None  # still a cached prefix until evicted
                else:
                    self._free.append(b)
        r.blocks = []
