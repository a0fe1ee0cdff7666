"""One model's vocabulary as text: tokens and their pieces, the chat template, the end-of-generation tokens."""

import ctypes
from collections.abc import Callable
from typing import Any

import llama_cpp as ll

from swarmtune.engine.conversation.chat_message import ChatMessage


class LlamaText:
    def __init__(self, model: Any, architecture: str) -> None:
        self.model = model
        self.vocab = ll.llama_model_get_vocab(model)
        self.n_vocab: int = ll.llama_vocab_n_tokens(self.vocab)
        self._eog: tuple[int, ...] | None = None  # the end-of-generation tokens, found when first wanted
        self._piece_buf = ctypes.create_string_buffer(256)
        self._pieces: dict[int, str] = {}
        self._bytes: dict[int, bytes] = {}
        self._template, self.chat_template = self._pick_template(model, architecture)

    def _pick_template(self, model: Any, architecture: str) -> tuple[bytes | None, str]:
        """The file's own template; else llama.cpp's built-in one for the model's family; ChatML last.
        Returns (what llama_chat_apply_template takes, or None for ChatML; how the header names it)."""
        own = ll.llama_model_chat_template(model, None)
        if own:
            return own, "the model's own (GGUF tokenizer.chat_template)"
        name = builtin_template_name(architecture, self._has_token)
        if name is not None and _applies(name.encode()):
            return name.encode(), f"llama.cpp built-in {name!r} (the GGUF has no template; family {architecture})"
        return None, f"ChatML (the GGUF has no template and llama.cpp has none for family {architecture})"

    def _has_token(self, text: str) -> bool:
        ids = self.tokenize(text)
        return len(ids) == 1 and self.piece(ids[0]) == text

    def tokenize(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (ll.llama_token * n_max)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, False, True)
        if n < 0:
            buf = (ll.llama_token * -n)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, -n, False, True)
        return list(buf[:n])

    def bos_token(self) -> int | None:
        """The BOS token where this model's vocabulary adds one at a text's start, else None."""
        tok = ll.llama_vocab_bos(self.vocab)
        return tok if tok >= 0 and ll.llama_vocab_get_add_bos(self.vocab) else None

    def piece(self, token: int) -> str:
        p = self._pieces.get(token)
        if p is None:
            p = self._pieces[token] = self.token_bytes(token).decode("utf-8", errors="replace")
        return p

    def check_grammar(self, grammar: str) -> str | None:
        """None where llama.cpp parses this GBNF (any thread: it reads only the vocabulary); else why not."""
        g = ll.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        if not g:
            return "llama.cpp could not parse the grammar"
        ll.llama_sampler_free(g)
        return None

    @property
    def jinja_template(self) -> str | None:
        """The GGUF's own chat template (Jinja), where it has one."""
        own = ll.llama_model_chat_template(self.model, None)
        return own.decode("utf-8", errors="replace") if own else None

    def special_text(self, which: str) -> str:
        """The text of the BOS or EOS token (what a Jinja template calls bos_token, eos_token)."""
        tok = ll.llama_vocab_bos(self.vocab) if which == "bos" else ll.llama_vocab_eos(self.vocab)
        return self.token_bytes(tok).decode("utf-8", errors="replace") if tok >= 0 else ""

    def token_bytes(self, token: int) -> bytes:
        """A token's own bytes: part of a UTF-8 character, where a character spans tokens."""
        b = self._bytes.get(token)
        if b is None:
            n = ll.llama_token_to_piece(self.vocab, token, self._piece_buf, 256, 0, True)
            b = self._bytes[token] = self._piece_buf.raw[: max(n, 0)]
        return b

    def chat(self, messages: list[ChatMessage], add_assistant: bool) -> str:
        if self._template is None:
            return _chatml(messages, add_assistant)
        arr = (ll.llama_chat_message * len(messages))()
        keep = []
        for i, m in enumerate(messages):
            role, content = m["role"].encode(), m["content"].encode()
            keep += [role, content]
            arr[i].role, arr[i].content = role, content
        size = 4096 + sum(len(m["content"]) * 2 for m in messages)
        buf = ctypes.create_string_buffer(size)
        n = ll.llama_chat_apply_template(self._template, arr, len(messages), add_assistant, buf, size)
        if n < 0:  # a template llama.cpp does not know
            return _chatml(messages, add_assistant)
        if n > size:
            buf = ctypes.create_string_buffer(n + 1)
            n = ll.llama_chat_apply_template(self._template, arr, len(messages), add_assistant, buf, n + 1)
        return buf.raw[:n].decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    def eog_tokens(self) -> tuple[int, ...]:
        if self._eog is None:  # once per model: 49k calls, ~20 ms
            self._eog = tuple(t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(self.vocab, t))
        return self._eog


# llama.cpp's built-in chat templates by name (llama-chat.cpp), for a model family whose GGUF carries none.
_FAMILY_TEMPLATES = {
    "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma",
    "phi3": "phi3", "phimoe": "phi3", "phi4": "phi4",
    "qwen2": "chatml", "qwen2moe": "chatml", "qwen3": "chatml", "qwen3moe": "chatml", "qwen3next": "chatml",
    "deepseek": "deepseek", "deepseek2": "deepseek3",
    "command-r": "command-r", "cohere2": "command-r",
    "chatglm": "chatglm4", "glm4": "chatglm4", "glm4moe": "chatglm4",
    "granite": "granite", "granitemoe": "granite", "granitehybrid": "granite",
    "exaone": "exaone3", "exaone4": "exaone4", "minicpm": "minicpm", "openai-moe": "gpt-oss", "gpt-oss": "gpt-oss",
    "rwkv6": "rwkv-world", "rwkv7": "rwkv-world", "bailingmoe": "bailing", "hunyuan-moe": "hunyuan-moe",
    "smolvlm": "smolvlm", "falcon-h1": "falcon3", "mistral3": "mistral-v7", "llama4": "llama4",
}


def builtin_template_name(architecture: str, has_token: Callable[[str], bool]) -> str | None:
    """The name of llama.cpp's built-in template for this family. The `llama` architecture covers
    Llama 2, Llama 3 and Mistral, told apart by their special tokens."""
    if architecture == "llama":
        if has_token("<|start_header_id|>"):
            return "llama3"
        if has_token("[INST]"):
            return "mistral-v1"
        return None
    return _FAMILY_TEMPLATES.get(architecture)


def _applies(template: bytes) -> bool:
    """llama.cpp knows this template (an unknown one makes llama_chat_apply_template return -1)."""
    msg = (ll.llama_chat_message * 1)()
    msg[0].role, msg[0].content = b"user", b"hi"
    buf = ctypes.create_string_buffer(256)
    return bool(ll.llama_chat_apply_template(template, msg, 1, True, buf, 256) >= 0)


def _chatml(messages: list[ChatMessage], add_assistant: bool) -> str:
    s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return s + ("<|im_start|>assistant\n" if add_assistant else "")
