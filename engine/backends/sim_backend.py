"""A backend with no model: step times from a hardware profile's roofline, deterministic.

Everything it produces is simulated; the engine labels it so.
"""

import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from swarmtune.engine.backends.backend import (
    NO_DRAFTS_RECURRENT,
    BackendInfo,
    CacheMismatch,
    Caps,
    Landing,
    NoKVSlot,
    VerifyLanding,
)
from swarmtune.engine.backends.clock import Clock, SimClock, WallClock
from swarmtune.engine.backends.sim_text import SimText
from swarmtune.engine.conversation.chunk_reuse import Chunk
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.kv.types import F16, KVSetting
from swarmtune.engine.model.model_facts import ModelFacts
from swarmtune.engine.model.profiles import Profile

_WORDS = (
    "def return self if else for in import from class with try except raise None True False the a "
    "value list dict index path file test fix bug patch diff line call args result error check update"
).split()

T = TypeVar("T")  # what a landing hands back: a decode's tokens, a verify step's kept runs


def sim_facts(p: Profile) -> ModelFacts:
    bm = p.bytes_model
    return ModelFacts(
        path=f"sim:{p.name}",
        name=p.model_name,
        architecture="sim",
        n_layer=len(bm.kv_values_per_layer) if p.layers is not None else 0,
        n_head=0,
        n_head_kv_per_layer=(),
        head_dim_k=0,
        head_dim_v=0,
        n_ctx_train=p.n_ctx_train,
        file_bytes=0,
        tensor_bytes=int(p.weight_bytes),
        weight_bytes=int(p.weight_bytes),
        embd_row_bytes=int(bm.embd_row_bytes),
        tied_output=not bm.embd_row_bytes,
        kv_values_per_token=p.kv_bytes_per_token_f16 / F16.bytes_for(1),
        bytes_model=bm,
    )


@dataclass(frozen=True)
class StepScale:
    """One KV type's step times as measured against a model: decode steps and prefill chunks times these
    factors, or, where `attention` is set, only what a decode step reads of the cache (what grows with the
    contexts) times it: a KV type differs from another in how it reads its cells, not in the weights."""

    decode: float = 1.0
    prefill: float = 1.0
    attention: float | None = None


@dataclass(frozen=True)
class _SavedSeq:
    tokens: int
    nbytes: int
    kv: KVSetting


def _landing(out: T, seconds: float, paced: bool) -> Callable[[], tuple[T, float]]:
    """What a step's launch returns: paced, it lands its modeled seconds after the launch, on the wall."""
    if not paced:
        return lambda: (out, seconds)
    lands_at = time.perf_counter() + seconds

    def landed() -> tuple[T, float]:
        if (left := lands_at - time.perf_counter()) > 0:
            time.sleep(left)
        return out, seconds
    return landed


class SimBackend:
    source = "simulated"
    text = SimText()
    max_chunk_tokens = 512
    # modeled: a host converting K and V rows at 1 GB/s. For scale, measured here: the default model's
    # 189 MB of f16 rows (8 x 1,024 tokens) converted to q8_0 in 0.49 s on 2 CPU threads (0.39 GB/s; a profile,
    # not a bench). A forecast's calibrated simulator uses the rate measured in its own run instead
    convert_bytes_per_s = 1.0e9

    def __init__(self, p: Profile, stated: Profile | None = None) -> None:
        self.profile = p  # the card as it is: every step's time comes from it
        # the card as its model states it: what a tuner forecasts with. The same by default; the bench's
        # mis-stated cards run on one profile and are described by another
        self.stated = stated or p
        # per KV type, step-time factors: a forecast's model of one type corrected by what the swarm measured
        # of it (engine/tune/); none by default
        self.scale: dict[KVSetting, StepScale] = {}
        self.facts = sim_facts(p)
        self.info = BackendInfo(name="sim", device=p.description, versions={},
                                settings={"profile": p.name, "chat_template": "ChatML (simulated tokenizer)"})
        self._len: dict[int, int] = {}
        self._rng: dict[int, random.Random] = {}
        self.kv = F16
        self.n_seqs = 0
        self.ctx_per_seq = 0
        self.kv_buffer_bytes: int | None = None
        # a decode step waits its modeled seconds on the wall: the simulated card stands in for a device that
        # runs while the host goes on (a prefill, a move, are still only modeled)
        self.paced = False

    def open(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int) -> None:
        self.kv, self.n_seqs, self.ctx_per_seq = kv, n_seqs, ctx_per_seq
        self._len = {}
        # what llama.cpp would allocate: full-attention cells, each stream's window, recurrent state
        self.kv_buffer_bytes = sum(self.profile.bytes_model.llama_cpp_cache_bytes(
            kv, n_seqs, ctx_per_seq, self.max_chunk_tokens).values())

    def new_clock(self) -> Clock:
        """A run's clock: this card's modeled seconds (a test's stand-in that calls its steps measured gets
        the wall's)."""
        return SimClock() if self.source == "simulated" else WallClock()

    def close(self) -> None:
        self._len = {}

    # a shadow of a running swarm (engine/tune/shadow.py): its caches as they stand, without prefilling them
    def adopt_cached(self, seq: int, tokens: int) -> None:
        """Sequence `seq` holds `tokens` cells, as the swarm's own cache does."""
        self._len[seq] = tokens

    def saved_stand_in(self, kv: KVSetting, tokens: int) -> _SavedSeq:
        """A history of `tokens` swapped out to host memory at type `kv`, as `save_seq` would leave it."""
        bm = self.profile.bytes_model
        return _SavedSeq(tokens, int(bm.kv_cache_bytes(kv, tokens) + bm.state_bytes), kv)

    @contextmanager
    def side_cache(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int) -> Iterator[None]:
        """A second, temporary cache, as on the real backend: the live one is back as it was after."""
        live = (self._len, self._rng, self.kv, self.n_seqs, self.ctx_per_seq)
        self._len, self._rng, self.kv, self.n_seqs, self.ctx_per_seq = {}, {}, kv, n_seqs, ctx_per_seq
        try:
            yield
        finally:
            self._len, self._rng, self.kv, self.n_seqs, self.ctx_per_seq = live

    def seed_sampler(self, seq: int, seed: int) -> None:
        self._rng[seq] = random.Random(seed)

    def set_sampler(self, seq: int, p: SamplingParams) -> None:
        self._rng[seq] = random.Random(p.seed)  # a simulated model has no logits to shape: only the draw

    def _expect(self, seq: int, pos: int) -> None:
        # A consistent cache takes a sequence's next token at its length and nowhere else; llama.cpp
        # itself refuses a gap in a non-empty sequence, and a gap in an empty one is this engine's bug.
        have = self._len.get(seq, 0)
        if pos != have:
            raise CacheMismatch(f"sequence {seq}: a token at position {pos}, but its cache holds {have} tokens")

    def _grow(self, seq: int, n: int) -> None:
        new = self._len.get(seq, 0) + n
        if new > self.ctx_per_seq:
            raise NoKVSlot()
        self._len[seq] = new

    def prefill(self, seq: int, tokens: list[int], pos0: int) -> float:
        self._expect(seq, pos0)
        self._grow(seq, len(tokens))
        return self.prefill_seconds(len(tokens), pos0, self.kv)

    def prefill_seconds(self, tokens: int, pos0: int, kv: KVSetting | None = None) -> float:
        """What prefilling `tokens` at pos0.. costs, without touching a cache."""
        sc = self.scale.get(kv or self.kv)
        return tokens / self.profile.prefill_tokens_per_s * (sc.prefill if sc else 1.0)

    def first_token_after_prefill(self, seq: int) -> int:
        return self._sample(seq)

    def _sample(self, seq: int) -> int:
        return self.text.id_of(" " + self._rng[seq].choice(_WORDS))

    def step_seconds(self, batch: int, total_context: float, kv: KVSetting | None = None,
                     contexts: list[float] | None = None) -> float:
        """The roofline: the bytes the step reads (engine/model/bytes_model.py) over the bandwidth, plus compute.
        contexts: each sequence's context (windowed layers read at most their window); else all equal."""
        p = self.profile
        kv = kv or self.kv
        ctx = contexts if contexts is not None else [total_context / max(batch, 1)] * batch
        step_bytes = p.bytes_model.step_bytes(kv, ctx)
        factor = _kv_cost(p, kv)
        if factor != 1.0:  # the KV read alone costs more (or less) than its bytes
            weights = p.bytes_model.step_bytes(kv, [0.0] * len(ctx))
            step_bytes = weights + factor * (step_bytes - weights)
        seconds = step_bytes / p.effective_bandwidth_bytes_per_s + batch * p.compute_seconds_per_token
        sc = self.scale.get(kv)
        if sc is None:
            return seconds
        if sc.attention is None:
            return seconds * sc.decode
        weights_s = p.bytes_model.step_bytes(kv, [0.0] * len(ctx)) / p.effective_bandwidth_bytes_per_s \
            + batch * p.compute_seconds_per_token
        return weights_s + sc.attention * (seconds - weights_s)

    # the simulated card's steps and cells are this one small object's
    @property
    def steps(self) -> "SimBackend":
        return self

    @property
    def cells(self) -> "SimBackend":
        return self

    @property
    def caps(self) -> Caps:
        bm = self.profile.bytes_model
        layout = "a sliding-window or recurrent cache (its state is not one K/V cache)" \
            if bm.has_swa or bm.state_bytes else None
        return Caps(shift=layout, mix=None, drafts=NO_DRAFTS_RECURRENT if bm.state_bytes else None, convert=layout,
                    launches_async=self.paced)

    def launch_decode(self, seqs: list[int], tokens: list[int], positions: list[int]) -> Landing:
        """Paced, the step lands its modeled seconds after the launch, on the wall: a sleep, which leaves the
        GIL to whatever the host does meanwhile, as a device leaves the CPU (bench/overlap.py)."""
        out, seconds = self._decode(seqs, tokens, positions)
        return _landing(out, seconds, self.paced)

    def launch_mixed(self, seqs: list[int], tokens: list[int], positions: list[int], prefill_seq: int,
                     prefill_tokens: list[int], pos0: int) -> Landing:
        """Modeled: the chunk's work hides under the step's weight stream, as far as that stream is long (a
        decode step leaves a card's compute idle while the weights stream); past it, it adds."""
        if self._len.get(prefill_seq, 0) + len(prefill_tokens) > self.ctx_per_seq:
            raise NoKVSlot()
        out, seconds = self._decode(seqs, tokens, positions)
        chunk = self.prefill(prefill_seq, prefill_tokens, pos0)
        weights = self.profile.bytes_model.step_bytes(self.kv, []) / self.profile.effective_bandwidth_bytes_per_s
        return _landing(out, seconds + max(0.0, chunk - weights), self.paced)

    def allow_drafts(self, n: int) -> str | None:
        return NO_DRAFTS_RECURRENT if n and self.profile.bytes_model.state_bytes else None

    def why_no_drafts(self, seq: int) -> str | None:
        return None

    def launch_verify(self, seqs: list[int], tokens: list[int], positions: list[int],
                      drafts: list[list[int]]) -> VerifyLanding:
        """Modeled: a decode step's read (weights, each agent's cells once) and each drafted row's compute."""
        for s, pos, d in zip(seqs, positions, drafts, strict=True):
            self._expect(s, pos)
            if self._len.get(s, 0) + 1 + len(d) > self.ctx_per_seq:
                raise NoKVSlot()
        kept = []
        for s, d in zip(seqs, drafts, strict=True):
            self._grow(s, 1 + len(d))
            k = []
            for i in range(len(d) + 1):
                k.append(self._sample(s))
                if i == len(d) or k[-1] != d[i]:
                    break
            kept.append(k)
        seconds = self.step_seconds(len(seqs), sum(positions) + len(seqs), contexts=[p + 1.0 for p in positions]) \
            + sum(len(d) for d in drafts) * self.profile.compute_seconds_per_token
        return _landing(kept, seconds, self.paced)

    def _decode(self, seqs: list[int], tokens: list[int], positions: list[int]) -> tuple[list[int], float]:
        total = sum(positions) + len(seqs)  # each sequence's attention reads its cache, this token included
        for s, pos in zip(seqs, positions, strict=True):
            self._expect(s, pos)
        if any(self._len.get(s, 0) + 1 > self.ctx_per_seq for s in seqs):
            raise NoKVSlot()  # the whole batch is refused, as llama_decode refuses it
        for s in seqs:
            self._grow(s, 1)
        contexts = [float(pos + 1) for pos in positions]
        return [self._sample(s) for s in seqs], self.step_seconds(len(seqs), total, contexts=contexts)

    def drop(self, seq: int) -> None:
        self._len.pop(seq, None)

    def truncate(self, seq: int, n_tokens: int) -> None:
        if seq in self._len:
            self._len[seq] = min(self._len[seq], n_tokens)

    def copy(self, src: int, dst: int) -> None:
        self._len[dst] = self._len.get(src, 0)

    def save_seq(self, seq: int) -> tuple[object, int, float]:
        n = self._len.get(seq, 0)
        nbytes = int(self.profile.bytes_model.kv_cache_bytes(self.kv, n) + self.profile.bytes_model.state_bytes)
        return _SavedSeq(n, nbytes, self.kv), nbytes, nbytes / self.profile.host_link_bytes_per_s

    def restore_seq(self, seq: int, handle: object) -> float:
        assert isinstance(handle, _SavedSeq)
        if handle.kv != self.kv:  # llama.cpp refuses a state saved from another cache type
            raise CacheMismatch(f"sequence {seq}: a state saved at KV {handle.kv} restored into a {self.kv} cache")
        if self._len.get(seq, 0):
            raise CacheMismatch(f"sequence {seq}: restored over {self._len[seq]} cached tokens")
        if handle.tokens > self.ctx_per_seq:
            raise NoKVSlot()
        self._len[seq] = handle.tokens
        return handle.nbytes / self.profile.host_link_bytes_per_s

    def why_no_room(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int) -> str | None:
        return None  # the simulated card's KV budget is the engine's to keep (--kv-budget-mb)

    def cut(self, seq: int, keep: int, chunks: Sequence[Chunk]) -> list[object]:
        self.truncate(seq, keep)
        if self.caps.shift is not None:
            return []
        return [_SavedSeq(c.tokens, int(self.profile.bytes_model.kv_cache_bytes(self.kv, c.tokens)), self.kv)
                for c in chunks]

    def paste(self, seq: int, kept: object, at: int) -> float:
        """Modeled as llama.cpp does it: the sequence and the chunk out to host memory and back."""
        assert isinstance(kept, _SavedSeq)
        if kept.kv != self.kv:
            raise CacheMismatch(f"sequence {seq}: a chunk cut at KV {kept.kv} pasted into a {self.kv} cache")
        self._expect(seq, at)
        if at + kept.tokens > self.ctx_per_seq:
            raise NoKVSlot()
        self._len[seq] = at + kept.tokens
        moved = 2 * self.profile.bytes_model.kv_cache_bytes(self.kv, at) + kept.nbytes
        return moved / self.profile.host_link_bytes_per_s

    def convert_saved(self, handle: object, kv: KVSetting) -> tuple[object, float]:
        """Modeled: the rows go to host memory and back over the profile's link (save_seq and restore_seq
        count that), and the host converts them at CONVERT_BYTES_PER_S."""
        assert isinstance(handle, _SavedSeq)
        nbytes = int(self.profile.bytes_model.kv_cache_bytes(kv, handle.tokens) + self.profile.bytes_model.state_bytes)
        return _SavedSeq(handle.tokens, nbytes, kv), handle.nbytes / self.convert_bytes_per_s

    def interrupt_with(self, should_stop: Callable[[], bool] | None) -> None:
        pass  # a simulated step takes no time to compute

    def span(self, seq: int) -> tuple[int, int]:
        n = self._len.get(seq, 0)
        return (0, n - 1) if n else (-1, -1)


def _kv_cost(p: Profile, kv: KVSetting) -> float:
    """The card's factor on a KV setting's read (Profile.kv_cost_factor): the setting's own where named, else
    K's and V's types' own, half each (a type not named costs 1)."""
    named: dict[str, float] = dict(p.kv_cost_factor)
    if kv.label in named:
        return named[kv.label]
    return 0.5 * named.get(kv.k.name, 1.0) + 0.5 * named.get(kv.v.name, 1.0)
