"""What an engine runs with, and the one place a value is checked: a bad value reads the same line
whether it came from a flag, a key, a typed command or an HTTP body."""

import math
import os
from dataclasses import dataclass, field
from typing import Literal

from swarmtune.engine.backends.backend import MAX_DRAFT_TOKENS
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import F16, KVSetting

MAX_AGENTS = 256


def check_default() -> bool:
    return os.environ.get("SWARMTUNE_CHECK", "0") == "1"


def check_agents(n: int) -> int:
    if not 1 <= n <= MAX_AGENTS:
        raise UserError(f"agents must be between 1 and {MAX_AGENTS} (got {n})", field="agents")
    return n


def cap_in_force(cap: int, agents: int) -> int:
    """The batch cap a swarm of this many agents runs at: a cap past the agents there are is all of them.
    The one place that rule is written (a cap asked for is checked against it in check_batch_cap)."""
    return min(cap, agents)


def check_batch_cap(cap: int, agents: int) -> int:
    if not 1 <= cap <= agents:
        raise UserError(f"batch cap must be between 1 and {agents} (got {cap})", field="batch_cap")
    return cap


def check_draft(n: int) -> int:
    if not 0 <= n <= MAX_DRAFT_TOKENS:
        raise UserError(f"draft length must be between 0 and {MAX_DRAFT_TOKENS} (got {n})", field="draft")
    return n


AUTO_DRAFT_TOKENS = 8  # draft auto: the most an agent drafts; the measured rule picks each agent's length


@dataclass(frozen=True)
class DraftSetting:
    """Speculation as a control: the most tokens an agent drafts into a decode step (0: off), and whether the
    measured rule picks each agent's length up to it (auto)."""

    tokens: int
    auto: bool = False

    @classmethod
    def parse(cls, value: object) -> "DraftSetting":
        """A flag's, a command's or an HTTP body's value: a whole number 0-16, or "auto"."""
        if value == "auto":
            return cls(AUTO_DRAFT_TOKENS, True)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"draft must be a whole number or auto (got {value!r})", field="draft")
        return cls(check_draft(value))

    @property
    def label(self) -> str:
        return "auto" if self.auto else str(self.tokens)


# --max-stall-ms auto: a prefill chunk between two decode steps takes at most this many times what each chunk
# adds to the newcomer's time to its first token (the decode step after it, and the call's own cost at its
# position: engine/batch_runner.py), so that chunking costs the prefill about 1/8 more, and a decoding agent's
# gap stays within 8 decode steps where a call's own cost is small. In steps, not milliseconds, so the same rule
# holds on a 40 ms CPU step and a 10 ms GPU one.
STALL_DECODE_STEPS = 8


def check_max_stall(seconds: float | None) -> float | None:
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise UserError(f"--max-stall-ms must be a number above 0 (got {seconds * 1000:g})", field="max_stall_s")
    return seconds


RESIDENCY = ("keep", "swap", "drop")


def check_residency(name: str) -> str:
    """Where an agent's history lives while it waits for a tool: kept in the cache, swapped out to host
    memory and back (no re-prefill), or dropped and re-prefilled when the tool returns."""
    if name not in RESIDENCY:
        raise UserError(f"residency must be one of {', '.join(RESIDENCY)} (got {name!r})", field="residency")
    return name


def check_tool_latency(median_s: float, sigma: float) -> None:
    if not math.isfinite(median_s) or median_s < 0:
        raise UserError(f"tool latency must be a finite number of seconds >= 0 (got {median_s})",
                        field="tool_latency_s")
    if not math.isfinite(sigma) or sigma < 0:
        raise UserError(f"tool latency sigma must be finite and >= 0 (got {sigma})", field="tool_latency_sigma")


def check_at_least_one(what: str, n: int) -> int:
    if n < 1:
        raise UserError(f"{what} must be at least 1 (got {n})")
    return n


def whole_number(what: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{what} needs a whole number (got {text!r})") from None


@dataclass
class EngineSettings:
    agents: int = 8
    batch_cap: int = 8
    kv: KVSetting = F16  # parsed where it came in (engine/kv/types.py: KVSetting.parse)
    seed: int = 0
    gen_tokens: int = 64  # T
    tool_tokens: int = 192  # M
    ctx_per_agent: int = 2048
    kv_budget_bytes: float | None = None  # None: every agent's full context fits
    chunk_tokens: int = 256
    # how long a tool call keeps an agent out of the batch: lognormal with this median (0: no wait, the
    # tool result arrives at once) and this sigma, drawn per call from the seed
    tool_latency_s: float = 0.0
    tool_latency_sigma: float = 1.0
    residency: str = "keep"  # keep | swap | drop: where a waiting agent's history lives
    # host memory for swapped-out histories; past it the least recently served swapped history is dropped
    # (prefilled again when its agent returns). None: no bound
    swap_limit_bytes: float | None = None
    reference: bool = True  # interleave batch-1 decode steps: the reference for measured speedup
    # a KV switch converts the cached K and V to the new type where the backend can (engine/kv/convert.py);
    # off, or where it cannot, every history is prefilled again
    kv_convert: bool = True
    check: bool = field(default_factory=check_default)  # after each step, every cache holds its agent's history
    # launch the next decode step before a step's record is written and published (engine/engine.py); None:
    # where the backend's steps run on a device while the host goes on
    overlap: bool | None = None
    # speculation: the most tokens an agent drafts from its own text into a decode step (0: off; engine/spec/)
    draft_tokens: int = 0
    draft_auto: bool = False  # each agent's length up to draft_tokens, from what was measured (engine/spec/)
    draft_model: str | None = None  # a GGUF sharing the model's vocabulary to draft from, not the agents' text
    # while agents decode, a prefill chunk is cut to what the run's measured chunk times say takes at most this
    # long (engine/measure/chunk_fit.py), so no decoding agent waits longer between tokens; None: chunk_tokens.
    # the stall bound: seconds, "auto" (STALL_DECODE_STEPS of the swarm's measured decode steps) or None (off)
    max_stall_s: float | Literal["auto"] | None = None
    # a decode step carries the next prefill chunk in the same call: True, False, or None: where the measured
    # seconds say it pays, on a device; two calls on the CPU (engine/spec/mix_policy.py)
    mix: bool | None = None

    def validate(self, n_ctx_train: int, no_drafts: str | None = None) -> None:
        """Refuses what cannot run, in one line; no_drafts: why the backend cannot verify drafts (None: it can)."""
        check_agents(self.agents)
        check_batch_cap(cap_in_force(self.batch_cap, self.agents), self.agents)
        check_at_least_one("gen tokens", self.gen_tokens)
        check_at_least_one("tool tokens", self.tool_tokens)
        check_tool_latency(self.tool_latency_s, self.tool_latency_sigma)
        check_residency(self.residency)
        check_draft(self.draft_tokens)
        if self.max_stall_s != "auto":
            check_max_stall(self.max_stall_s)
        if self.draft_tokens and no_drafts:
            raise UserError(f"--draft {self.draft_tokens}: no speculation on this model: {no_drafts}", field="draft")
        if self.swap_limit_bytes is not None and not (math.isfinite(self.swap_limit_bytes) and
                                                      self.swap_limit_bytes >= 0):
            raise UserError(f"--swap-limit-mb must be a finite number >= 0 (got {self.swap_limit_bytes / 1e6})")
        need = min_context(self)
        if self.ctx_per_agent < need:
            raise UserError(f"--ctx {self.ctx_per_agent} cannot hold one agent turn (needs at least {need} tokens)")
        if n_ctx_train and self.ctx_per_agent > n_ctx_train:
            raise UserError(f"--ctx {self.ctx_per_agent} exceeds the model's trained context ({n_ctx_train})")


def min_context(s: EngineSettings) -> int:
    return 160 + s.gen_tokens + s.tool_tokens + 64  # system prompt and task, one turn, the template's tags
