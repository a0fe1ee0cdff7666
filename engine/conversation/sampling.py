"""How one agent picks its next token: the fields an OpenAI request may set, with llama.cpp's defaults
where it sets none. Each agent's sampler is its own, so agents in one batch sample as they asked."""

from dataclasses import dataclass

SYNTHETIC_TOP_K = 40  # the synthetic swarm's agents: top-k 40 at temperature 0.8, seeded per task
SYNTHETIC_TEMPERATURE = 0.8


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = SYNTHETIC_TEMPERATURE  # 0: greedy
    top_k: int = SYNTHETIC_TOP_K  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64  # how many of its last tokens the penalties look at (llama.cpp's default)
    grammar: str | None = None  # GBNF every token must keep to (a tool call, a JSON schema); None: free
    # lazy: the grammar holds only from where one of these regexes first matches the reply (its first group's
    # start, or the match's), as llama-server holds a call under tool_choice auto; (): from the first token
    grammar_triggers: tuple[str, ...] = ()
    ignore_eos: bool = False  # never draw an end of generation: the turn runs to its max_tokens (benchmarks)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
