"""A backend with no model: step times from a hardware profile's roofline, deterministic.

Everything it produces is simulated; the engine labels it so.
"""

import random

from engine.backend import BackendInfo, NoKVSlot
from engine.kv_types import KV_TYPES, kv_type
from engine.model_facts import ModelFacts
from engine.profiles import Profile

_WORDS = (
    "def return self if else for in import from class with try except raise None True False the a "
    "value list dict index path file test fix bug patch diff line call args result error check update"
).split()
_CHARS_PER_TOKEN = 4


def sim_facts(p: Profile) -> ModelFacts:
    return ModelFacts(
        path=f"sim:{p.name}",
        name=p.model_name,
        architecture="sim",
        n_layer=0,
        n_head=0,
        n_head_kv_per_layer=(),
        head_dim_k=0,
        head_dim_v=0,
        n_ctx_train=p.n_ctx_train,
        file_bytes=0,
        tensor_bytes=int(p.weight_bytes),
        weight_bytes=int(p.weight_bytes),
        embd_row_bytes=0,
        tied_output=True,
        kv_values_per_token=p.kv_bytes_per_token_f16 / KV_TYPES["f16"].bytes_for(1),
    )


class SimBackend:
    source = "simulated"
    max_chunk_tokens = 512

    def __init__(self, p: Profile) -> None:
        self.profile = p
        self.facts = sim_facts(p)
        self.info = BackendInfo(name="sim", device=p.description, versions={}, settings={"profile": p.name})
        self._len: dict[int, int] = {}
        self._rng: dict[int, random.Random] = {}
        self._vocab: dict[str, int] = {}
        self._pieces: list[str] = []
        self.kv = "f16"
        self.n_seqs = 0
        self.ctx_per_seq = 0
        self.kv_buffer_bytes: int | None = None

    def open(self, kv: str, n_seqs: int, ctx_per_seq: int) -> None:
        kv_type(kv)
        self.kv, self.n_seqs, self.ctx_per_seq = kv, n_seqs, ctx_per_seq
        self._len = {}
        self.kv_buffer_bytes = int(n_seqs * ctx_per_seq * self.facts.kv_bytes_per_token(kv))

    def close(self) -> None:
        self._len = {}

    def tokenize(self, text: str) -> list[int]:
        out = []
        for i in range(0, len(text), _CHARS_PER_TOKEN):
            out.append(self._id(text[i : i + _CHARS_PER_TOKEN]))
        return out

    def _id(self, piece: str) -> int:
        t = self._vocab.get(piece)
        if t is None:
            t = self._vocab[piece] = len(self._pieces)
            self._pieces.append(piece)
        return t

    def piece(self, token: int) -> str:
        return self._pieces[token] if 0 <= token < len(self._pieces) else ""

    def chat(self, messages: list[dict[str, str]], add_assistant: bool) -> str:
        s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return s + ("<|im_start|>assistant\n" if add_assistant else "")

    def is_eog(self, token: int) -> bool:
        return False

    def seed_sampler(self, seq: int, seed: int) -> None:
        self._rng[seq] = random.Random(seed)

    def _grow(self, seq: int, n: int) -> None:
        new = self._len.get(seq, 0) + n
        if new > self.ctx_per_seq:
            raise NoKVSlot()
        self._len[seq] = new

    def prefill(self, seq: int, tokens: list[int], pos0: int) -> float:
        self._len[seq] = pos0
        self._grow(seq, len(tokens))
        return len(tokens) / self.profile.prefill_tokens_per_s

    def first_token_after_prefill(self, seq: int) -> int:
        return self._sample(seq)

    def _sample(self, seq: int) -> int:
        return self._id(" " + self._rng[seq].choice(_WORDS))

    def step_seconds(self, batch: int, total_context: float, kv: str | None = None) -> float:
        p = self.profile
        k = self.facts.kv_bytes_per_token(kv or self.kv)
        memory_s = (p.weight_bytes + total_context * k) / p.effective_bandwidth_bytes_per_s
        return memory_s + batch * p.compute_seconds_per_token

    def decode(self, seqs: list[int], tokens: list[int], positions: list[int]) -> tuple[list[int], float]:
        total = sum(positions) + len(seqs)  # each sequence's attention reads its cache, this token included
        for s, pos in zip(seqs, positions, strict=True):
            self._len[s] = pos
            self._grow(s, 1)
        return [self._sample(s) for s in seqs], self.step_seconds(len(seqs), total)

    def drop(self, seq: int) -> None:
        self._len.pop(seq, None)

    def truncate(self, seq: int, n_tokens: int) -> None:
        if seq in self._len:
            self._len[seq] = min(self._len[seq], n_tokens)

    def copy(self, src: int, dst: int) -> None:
        self._len[dst] = self._len.get(src, 0)
