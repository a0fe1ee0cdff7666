"""Which drafts ride a decode step: each agent's from the n-gram drafter (or a draft model, --draft-model), at
most the draft length in force, none past its context or its turn's limit, none where its backend cannot
verify them exactly, and no more rows than one call carries. Counts what each agent's drafts earned, on the
agent: drafted against kept."""

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from swarmtune.engine.agents.agent import Agent
from swarmtune.engine.backends.backend import Backend
from swarmtune.engine.errors import UserError
from swarmtune.engine.spec.draft_model_limits import DRAFT_CALL_TOKENS
from swarmtune.engine.spec.draft_policy import DraftPolicy
from swarmtune.engine.spec.ngram_drafter import NgramDrafter

if TYPE_CHECKING:
    from swarmtune.engine.spec.model_drafter import ModelDrafter

class Drafts:
    def __init__(self, backend: Backend, turn_left: Callable[[Agent], int]) -> None:
        self.backend = backend
        self.turn_left = turn_left  # tokens an agent's turn may still generate
        self.drafter = NgramDrafter()
        self.policy: DraftPolicy | None = None  # --draft auto: the lengths from what was measured
        self.room = 0  # the drafted rows a sequence the backend's contexts are made for (allow_drafts)
        self.model: ModelDrafter | None = None  # --draft-model: drafts from it instead of the n-gram lookup
        # seconds the last step's drafting took where they are the device's (a draft model's calls): the step's
        # own, added to its record; the n-gram lookup's are the host's bookkeeping, as the rest of it
        self.spent_s = 0.0

    def use_model(self, path: str) -> None:
        """Drafts from the model at path (its vocabulary the target's): llama.cpp's, on the target's device."""
        from swarmtune.engine.spec.model_drafter import ModelDrafter

        vocab = getattr(self.backend, "vocab", None)
        if vocab is None:  # the simulated card has no tokens a model could guess
            raise UserError("--draft-model needs a model run by llama.cpp (a simulated card has no text to draft)",
                            field="draft_model")
        on_device = bool(getattr(self.backend, "offloaded_layers", 0))
        device = getattr(self.backend, "device", None) if on_device else None
        self.model = ModelDrafter(path, vocab, getattr(self.backend, "n_threads", 1), on_device,
                                  None if device is None else lambda model, cells: _draft_room(device, path, cells))

    def close(self) -> None:
        if self.model is not None:
            self.model.close()
            self.model = None

    def make_room(self, n: int) -> bool:
        """Contexts made from now on verify up to n drafts a sequence; True where that is more than the live one
        was made for (it must be made again before n can ride)."""
        if n <= self.room:
            return False
        self.backend.allow_drafts(n)
        self.room = n
        return True

    def set_length(self, n: int, auto: bool) -> None:
        """At most n tokens an agent; auto: each agent's length from the policy."""
        if not auto and n:
            self.policy = None
        elif not auto:  # off: the policy's figures are kept (its plain steps still timed) for auto's return
            return
        elif self.policy is None or self.policy.max_tokens != n:
            self.policy = DraftPolicy(n)

    def for_batch(self, batch: list[Agent], n: int) -> list[list[int]] | None:
        """Each batched agent's drafts for this step ([] for none), n at most each; None where none has any."""
        self.spent_s = 0.0
        rows_left = self.backend.max_chunk_tokens - len(batch)
        if self.model is not None:
            lengths = self.policy.lengths([a.id for a in batch]) if self.policy is not None else [n] * len(batch)
            return self._from_model(batch, lengths, rows_left)
        # every agent's longest draft first: under auto, the length taken depends on the match behind it (no
        # lookups where not even drafts all kept could pay: they took 0.24 ms a step of 64 agents, measured on a
        # 2-core AVX-512 EPYC)
        look = self.policy is None or self.policy.could_pay(len(batch))
        found = [self.drafter.lookup(a, room) if look and (room := self._room(a, n, rows_left)) > 0 else ([], 0)
                 for a in batch]
        lengths = [n] * len(batch) if self.policy is None else \
            self.policy.lengths([a.id for a in batch], [c for _, c in found])
        out = []
        for a, want, (d, _) in zip(batch, lengths, found, strict=True):
            room = self._room(a, want, rows_left)
            out.append(d[:room] if room > 0 else [])
            rows_left -= len(out[-1])
        return out if any(out) else None

    def _room(self, a: Agent, want: int, rows_left: int) -> int:
        # its fed token and its drafts take cells; the token drawn after the last draft needs one more
        room = min(want, a.limit - a.context - 3, self.turn_left(a) - 1, rows_left)
        return room if room > 0 and self.backend.steps.why_no_drafts(a.seq) is None else 0

    def _from_model(self, batch: list[Agent], lengths: list[int], rows_left: int) -> list[list[int]] | None:
        """The draft model's drafts (every agent's in the same calls): its seconds are the step's."""
        assert self.model is not None
        rooms = []
        for a, want in zip(batch, lengths, strict=True):
            rooms.append(self._room(a, want, rows_left))
            rows_left -= rooms[-1]
        if not any(rooms):
            return None
        t0 = time.perf_counter()
        n_seqs, per_seq = getattr(self.backend, "n_seqs", 1), getattr(self.backend, "ctx_per_seq", 0)
        out = self.model.draft_many(batch, rooms, n_seqs, n_seqs * per_seq)
        self.spent_s = time.perf_counter() - t0
        if self.policy is not None and self.model.rounds:
            # a drafted token's cost: the calls after the first, which also brings the cache level with
            # everything new (a tool's result, or all since the rule last measured) and would inflate it
            self.policy.drafting(self.model.rounds, self.model.round_s)
        return out if any(out) else None

    def observed(self, batch: int, seconds: float, drafted: int) -> None:
        """A decode step's time, for the policy (--draft auto)."""
        if self.policy is not None:
            self.policy.observed(batch, seconds, drafted)

    def verified(self, a: Agent, drafted: int, agreed: int) -> None:
        """a drafted these tokens into a step, and its draws agreed with the first `agreed` of them."""
        a.drafts_verified(drafted, agreed)
        if self.policy is not None:
            self.policy.verified(a.id, drafted, agreed)


def _draft_room(device: object, path: str, cells: int) -> str | None:
    """None where a draft cache of `cells` cells (f16, one stream) fits the device now; else why not."""
    from swarmtune.engine.backends.devices import Device, cache_tensor_bytes, free_bytes, why_cache_does_not_fit
    from swarmtune.engine.kv.types import F16
    from swarmtune.engine.model.model_facts import read_model_facts

    assert isinstance(device, Device)
    tensor, total = cache_tensor_bytes(read_model_facts(path).bytes_model, F16, 1, cells, DRAFT_CALL_TOKENS)
    why = why_cache_does_not_fit(device, tensor, total, free_bytes(device))
    return None if why is None else f"the draft model's cache: {why}"
