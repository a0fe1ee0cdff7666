"""Where a lazy grammar's trigger fires (tool_choice auto: the call's grammar holds from where the model begins
a call), watched on the host, so that a token llama.cpp would abort on is never given to it.

llama.cpp's lazy grammar keeps the text of the tokens it accepts until a trigger pattern matches, then
replays the text from the match on into the grammar. Where the token that completes the trigger goes on past
it in a way the grammar refuses (SmolLM2 spells `<tool_call>` in pieces, and `><` is one of its tokens), the
replay throws from inside the sampler, through C, and the process aborts: every client's server with it. So
before such a token is accepted, the same match is found here (Python's `re` on the same text, the patterns
being plain ones both engines read alike), and the text from it checked on a fresh grammar, token by token,
with the sampler's own apply (which refuses, never throws). A token that fails is one the grammar refused."""

import ctypes
import math
import re
from typing import Any

import llama_cpp as ll


class LazyTrigger:
    def __init__(self, vocab: Any, grammar: str, triggers: tuple[str, ...]) -> None:
        self.vocab, self.grammar = vocab, grammar.encode()
        self.patterns = [re.compile(t) for t in triggers]
        self.text = ""  # what the grammar has been given while it waits
        self.fired = False

    def copy(self) -> "LazyTrigger":
        c = LazyTrigger.__new__(LazyTrigger)
        c.vocab, c.grammar, c.patterns, c.text, c.fired = self.vocab, self.grammar, self.patterns, self.text, self.fired
        return c

    def allows(self, token: int) -> bool:
        """Whether llama.cpp can accept `token` without aborting: it completes no trigger, or the text from the
        trigger on, this token's part included, is a start the grammar takes."""
        if self.fired:
            return True
        text = self.text + self.piece(token)
        start = self._start(text)
        return start is None or self._takes(text[start:])

    def accepted(self, token: int) -> None:
        if self.fired:
            return
        self.text += self.piece(token)
        if self._start(self.text) is not None:
            self.fired, self.text = True, ""

    def piece(self, token: int) -> str:
        buf = ctypes.create_string_buffer(256)
        n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", "replace")

    def _start(self, text: str) -> int | None:
        """Where the grammar starts, as llama.cpp finds it: the first pattern that matches, its first group's
        start (the match's, without a group)."""
        for p in self.patterns:
            if (m := p.search(text)) is not None:
                return m.start(1) if p.groups and m.start(1) >= 0 else m.start()
        return None

    def _takes(self, text: str) -> bool:
        g = ll.llama_sampler_init_grammar(self.vocab, self.grammar, b"root")
        one = ll.llama_token_data()
        arr = ll.llama_token_data_array(ctypes.pointer(one), 1, -1, False)
        data = text.encode()
        buf = (ll.llama_token * (len(data) + 8))()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, True)
        try:
            for tok in buf[: max(n, 0)]:
                one.id, one.logit, one.p = ll.llama_token(tok), 1.0, 0.0
                arr.size, arr.selected, arr.sorted = 1, -1, False
                ll.llama_sampler_apply(g, ctypes.byref(arr))
                if one.logit == -math.inf:
                    return False
                ll.llama_sampler_accept(g, tok)
            return bool(n >= 0)
        finally:
            ll.llama_sampler_free(g)
