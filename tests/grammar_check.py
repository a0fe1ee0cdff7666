"""Whether llama.cpp's grammar sampler lets a text through, token by token, ending where the grammar ends:
the check a family's call grammar (engine/conversation/formats/) must pass on the replies the family really
writes. The vocabulary is a tiny GGUF's, whose byte tokens spell any text, so every character is checked."""

import ctypes
import math
from pathlib import Path

import llama_cpp as ll

from tests.tiny_gguf import llama_dense


class GrammarCheck:
    def __init__(self, tmp: Path) -> None:
        path = llama_dense(tmp / "vocab.gguf", "{{ messages }}")
        params = ll.llama_model_default_params()
        params.vocab_only = True
        self.model = ll.llama_model_load_from_file(str(path).encode(), params)
        assert self.model, "the tiny GGUF loads"
        self.vocab = ll.llama_model_get_vocab(self.model)

    def tokens(self, text: str) -> list[int]:
        data = text.encode()
        buf = (ll.llama_token * (len(data) + 8))()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, False)
        assert n >= 0
        return list(buf[:n])

    def accepts(self, grammar: str, text: str, triggers: tuple[str, ...] = ()) -> bool:
        """The grammar (lazy, with triggers) lets every token of `text` through, and then an end of text."""
        if triggers:
            pats = (ctypes.c_char_p * len(triggers))(*(t.encode() for t in triggers))
            g = ll.llama_sampler_init_grammar_lazy_patterns(self.vocab, grammar.encode(), b"root", pats,
                                                            len(triggers), None, 0)
        else:
            g = ll.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        assert g, "llama.cpp parses the grammar"
        one = ll.llama_token_data()
        arr = ll.llama_token_data_array(ctypes.pointer(one), 1, -1, False)
        try:
            for tok in [*self.tokens(text), ll.llama_vocab_eos(self.vocab)]:
                one.id, one.logit, one.p = tok, 1.0, 0.0
                arr.size, arr.selected, arr.sorted = 1, -1, False
                ll.llama_sampler_apply(g, ctypes.byref(arr))
                if one.logit == -math.inf:
                    return False
                ll.llama_sampler_accept(g, tok)
            return True
        finally:
            ll.llama_sampler_free(g)

    def close(self) -> None:
        ll.llama_model_free(self.model)
