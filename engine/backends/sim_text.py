"""The simulated model's text: four characters a token, one vocabulary shared by every simulated backend in
the process, ChatML for a template."""

from typing import ClassVar

from swarmtune.engine.conversation.chat_message import ChatMessage

_CHARS_PER_TOKEN = 4


class SimText:
    # one vocabulary for every simulated backend in the process: a forecast makes a fresh one per run forward,
    # and tokenizing the same tool results into it again was a sixth of a simulated tuner's time
    _vocab: ClassVar[dict[str, int]] = {}
    _pieces: ClassVar[list[str]] = []
    _tokenized: ClassVar[dict[str, tuple[int, ...]]] = {}

    def tokenize(self, text: str) -> list[int]:
        hit = self._tokenized.get(text)
        if hit is None:
            hit = tuple(self.id_of(text[i : i + _CHARS_PER_TOKEN]) for i in range(0, len(text), _CHARS_PER_TOKEN))
            if len(text) >= 256 and len(self._tokenized) < 4096:  # tool results and prompts, not generated words
                self._tokenized[text] = hit
        return list(hit)

    def id_of(self, piece: str) -> int:
        t = self._vocab.get(piece)
        if t is None:
            t = len(self._pieces)
            self._pieces.append(piece)
            self._vocab[piece] = t
        return t

    def piece(self, token: int) -> str:
        return self._pieces[token] if 0 <= token < len(self._pieces) else ""

    def chat(self, messages: list[ChatMessage], add_assistant: bool) -> str:
        s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return s + ("<|im_start|>assistant\n" if add_assistant else "")

    def is_eog(self, token: int) -> bool:
        return False

    def token_bytes(self, token: int) -> bytes:
        return self.piece(token).encode("utf-8")

    def check_grammar(self, grammar: str) -> str | None:
        return None  # a simulated model writes words, not text a grammar could hold: it ignores one

    jinja_template: str | None = None  # it renders ChatML (chat())

    def special_text(self, which: str) -> str:
        return ""
