"""The KV budget in tokens: how many tokens of full-attention cache it holds at a KV type over every agent's
stream. Each agent's window cells (windowed layers keep window + one ubatch) and recurrent state are fixed
costs; the full-attention layers' tokens share what is left (engine/model/bytes_model.py)."""

from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.model.model_facts import ModelFacts
from swarmtune.engine.settings import EngineSettings


class KVBudget:
    def __init__(self, facts: ModelFacts, settings: EngineSettings) -> None:
        self.facts = facts
        self.s = settings  # the engine's own: the budget, the context and the chunk as they are now
        self._known: dict[tuple[KVSetting, int, float | None], int] = {}  # computed once per key

    def tokens(self, kv: KVSetting, slots: int) -> int:
        key = (kv, slots, self.s.kv_budget_bytes)
        if key not in self._known:
            self._known[key] = self._tokens(kv, slots)
        return self._known[key]

    def _tokens(self, kv: KVSetting, slots: int) -> int:
        if self.s.kv_budget_bytes is None:
            return slots * self.s.ctx_per_agent
        return self.facts.bytes_model.budget_tokens(self.s.kv_budget_bytes, kv, slots, self.s.ctx_per_agent,
                                                    swa_slack_tokens=self.s.chunk_tokens)
