"""What the engine needs from a decode backend: the real one (llama.cpp) or the simulated one."""

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from swarmtune.engine.backends.clock import Clock
from swarmtune.engine.conversation.chat_message import ChatMessage
from swarmtune.engine.conversation.chunk_reuse import Chunk
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.model_facts import ModelFacts


class NoKVSlot(Exception):
    """llama_decode returned 1: the cache cannot hold this batch. A scheduling event, not a failure."""


class CacheMismatch(RuntimeError):
    """A sequence's cache does not hold what its agent's history says: every number after it would be fiction."""


@dataclass(frozen=True)
class BackendInfo:
    name: str  # llama.cpp | sim
    device: str
    versions: dict[str, str] = field(default_factory=dict)
    settings: dict[str, object] = field(default_factory=dict)


NO_DRAFTS_RECURRENT = "a recurrent state cannot take back the drafts it rejected"
MAX_DRAFT_TOKENS = 16  # the most drafted tokens a verify step carries for one sequence (--draft N)

# what a launched decode step returns when waited for: each sequence's next token, and seconds
Landing = Callable[[], tuple[list[int], float]]
# a launched verify step's: per sequence, the tokens it keeps (the drafts its draws agreed with, then the draw
# after them), and seconds
VerifyLanding = Callable[[], tuple[list[list[int]], float]]


@dataclass(frozen=True)
class Caps:
    """What a backend can do, computed when it opens a context: None where it can, else why not."""

    shift: str | None = None  # cached cells moved to other positions (chunk reuse)
    mix: str | None = None  # a decode step that carries a prefill chunk in the same call
    drafts: str | None = None  # drafted rows verified, their rejected cells removed (a recurrent state cannot)
    convert: str | None = None  # a saved state's K and V rows converted to another KV type
    transposed_v: bool = False  # V is stored transposed (no flash attention): only quantized types convert
    launches_async: bool = False  # a device runs a step while the host goes on: a launch returns before it ends

    def converts(self, kv_from: KVSetting, kv_to: KVSetting) -> str | None:
        """None where a saved state converts from one KV type to the other; else why not."""
        if self.convert is not None:
            return self.convert
        if self.transposed_v and not (kv_from.quantized and kv_to.quantized):
            return "V is stored transposed without flash attention"
        return None


class Text(Protocol):
    """The model's vocabulary and chat template."""

    def tokenize(self, text: str) -> list[int]: ...

    def piece(self, token: int) -> str: ...

    def token_bytes(self, token: int) -> bytes:
        """A token's bytes (`piece` is their text, a split character replaced)."""

    def chat(self, messages: list[ChatMessage], add_assistant: bool) -> str: ...

    def is_eog(self, token: int) -> bool: ...

    def check_grammar(self, grammar: str) -> str | None:
        """None where a sampler can keep to this GBNF (any thread); else why not."""

    @property
    def jinja_template(self) -> str | None:
        """The model's own chat template (Jinja), where it has one."""

    def special_text(self, which: str) -> str:
        """The text of the "bos" or "eos" token."""


class Steps(Protocol):
    """The steps the open context runs, and how each sequence draws its tokens."""

    def seed_sampler(self, seq: int, seed: int) -> None:
        """seq samples as the synthetic swarm's agents do (engine/conversation/sampling.py), from this seed."""

    def set_sampler(self, seq: int, params: SamplingParams) -> None:
        """seq samples as params say, until it is set again."""

    def prefill(self, seq: int, tokens: list[int], pos0: int) -> float:
        """Ingest tokens into seq's cache at pos0.. (at most max_chunk_tokens); returns seconds."""

    def first_token_after_prefill(self, seq: int) -> int:
        """Sample seq's next token from the last row of the prefill just run."""

    def launch_decode(self, seqs: list[int], tokens: list[int], positions: list[int]) -> Landing:
        """One step, one token per sequence, one call, begun: the step is on its way (NoKVSlot raised here); the
        host may do other work, touching nothing of this backend, until it calls what this returns, which
        waits for the step and returns each sequence's next token and seconds."""

    def why_no_drafts(self, seq: int) -> str | None:
        """None where seq's drafts can be verified (its rejected cells removed and its draws exact); else why
        not, in a few words."""

    def launch_verify(self, seqs: list[int], tokens: list[int], positions: list[int],
                      drafts: list[list[int]]) -> VerifyLanding:
        """launch_decode with drafted tokens after each sequence's own (none: []): every row's cell written and
        drawn. What it returns gives each sequence's kept tokens; the cells of the drafts it did not keep are
        still there, for the caller to truncate. Drafts a sequence's grammar rejects are cut from its list
        (in place) before the step."""

    def launch_mixed(self, seqs: list[int], tokens: list[int], positions: list[int], prefill_seq: int,
                     prefill_tokens: list[int], pos0: int) -> Landing:
        """launch_decode that also ingests prefill_tokens into prefill_seq's cache at pos0.. in the same call;
        what it returns lands the decode as launch_decode's does, and first_token_after_prefill then draws
        from the chunk's last row. NoKVSlot refuses both."""


class Cells(Protocol):
    """The open context's sequences' cells."""

    def span(self, seq: int) -> tuple[int, int]:
        """(first, last) position seq's cache holds; (-1, -1) when it holds none."""

    def drop(self, seq: int) -> None:
        """Free seq's cache."""

    def truncate(self, seq: int, n_tokens: int) -> None:
        """Keep only seq's first n_tokens cached tokens."""

    def copy(self, src: int, dst: int) -> None:
        """Make dst's cache a copy of src's."""

    def save_seq(self, seq: int) -> tuple[object, int, float]:
        """Copy seq's state (its cells, and a recurrent state) to host memory: (handle, bytes, seconds).
        The cache still holds it; the caller drops it."""

    def restore_seq(self, seq: int, handle: object) -> float:
        """Put a saved state back into the empty seq; returns seconds. NoKVSlot when the cache has no room."""

    def cut(self, seq: int, keep: int, chunks: Sequence[Chunk]) -> list[object]:
        """Keep seq's first `keep` cells; each chunk's cells are saved apart first (one handle each), to be
        put back by paste() once the tokens before it are prefilled. [] where they cannot be."""

    def paste(self, seq: int, kept: object, at: int) -> float:
        """Put a chunk cut() saved at position `at`, right after seq's last cell; returns seconds. NoKVSlot
        (seq is then empty) where the cache has no room."""

    def convert_saved(self, handle: object, kv: KVSetting) -> tuple[object, float]:
        """A saved state (save_seq) with its K and V rows in type kv: (handle, seconds). Raises
        Unconvertible (engine/kv/convert.py) where its layout is not one it can convert."""


class Backend(Protocol):
    """A model loaded, and the context its swarm runs on: its parts do the work (text, steps, cells); what it
    can do is caps."""

    source: str  # measured | simulated
    facts: ModelFacts
    info: BackendInfo
    max_chunk_tokens: int  # the most tokens one prefill call may carry

    @property
    def n_seqs(self) -> int:
        """Sequences the open cache holds."""

    @property
    def caps(self) -> Caps: ...

    @property
    def text(self) -> Text: ...

    @property
    def steps(self) -> Steps:
        """The open context's (a side cache's while one is held)."""

    @property
    def cells(self) -> Cells:
        """The open context's (a side cache's while one is held)."""

    def open(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int) -> None:
        """(Re)create the cache: n_seqs independent sequences of ctx_per_seq cells each; all cached data is lost."""

    def close(self) -> None: ...

    def new_clock(self) -> Clock:
        """A clock for a run on this backend (engine/backends/clock.py): the wall's, or a simulated card's."""

    def side_cache(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int) -> AbstractContextManager[None]:
        """While held, steps and cells work on a second, temporary cache of KV type kv; the live cache (and
        its samplers) is back as it was after. A KV type is timed there without touching the swarm."""

    def why_no_room(self, kv: KVSetting, n_seqs: int, ctx_per_seq: int) -> str | None:
        """None where the device can hold a cache of n_seqs streams of ctx_per_seq cells at kv in place of the
        live one; else why not, in one line (asked before a control that would rebuild the cache)."""

    def allow_drafts(self, n: int) -> str | None:
        """Contexts opened from now on verify up to n drafted tokens a sequence (0: none); None, or why it
        cannot (then nothing changes)."""

    def interrupt_with(self, should_stop: Callable[[], bool] | None) -> None:
        """While set, a long call gives up (raising Interrupted) as soon as should_stop() says so."""
