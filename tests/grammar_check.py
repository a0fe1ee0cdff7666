"""Whether llama.cpp's grammar sampler lets a text through, token by token, ending where the grammar ends:
the check a family's call grammar (engine/conversation/formats/) must pass on the replies the family really
writes. The vocabulary is a tiny GGUF's, whose byte tokens spell any text, so every character is checked."""

import ctypes
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import llama_cpp as ll

from swarmtune.engine.agents.prompt import PromptRenderer
from swarmtune.engine.agents.served import ServedAgents
from swarmtune.engine.agents.served_request import Finished, ServedRequest
from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.conversation.formats.reader import ReplyReader
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.engine import Engine
from swarmtune.engine.model.model_facts import read_model_facts
from swarmtune.engine.settings import EngineSettings
from swarmtune.server.bridge import Bridge, plan_tools
from tests.llama_templates import template
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


@dataclass
class OneCall:
    """What one served request under a family's call grammar left: the callers' family checks read these."""
    renderer: PromptRenderer  # its backend is closed; family, picked and template stay readable
    text: str  # the rendered prompt
    grammar: str
    triggers: tuple[str, ...]
    out: str  # the reply as the model wrote it
    reply: Reply


def one_call_under_grammar(tmp_path: Path, template_name: str, tool: dict[str, Any], reader_name: str, *,
                           variables: dict[str, Any] | None = None, choice: str | None = "required",
                           tail: int = 64, seed: int = 3, max_tokens: int = 400, steps: int = 600) -> OneCall:
    """End to end: the real template (tests/llama_templates.py) on a tiny random-weight GGUF, one served request
    under the grammar, which must end the reply (reason "stop", not max_tokens) with one call to `tool` whose
    arguments validate. choice: tool_choice through the server's plan (plan_tools, then Bridge.held from the
    prompt's end); None: the format's call_grammar as it stands. tail: prompt characters the reader is told."""
    backend = LlamaBackend(read_model_facts(llama_dense(tmp_path / "m.gguf", template(template_name))), n_threads=1)
    try:
        renderer = PromptRenderer(backend)
        fmt = renderer.picked.fmt
        text = renderer.render([{"role": "user", "content": "read a file"}], [tool], variables)
        reader = ReplyReader(fmt, ReplyContext(prompt_tail=text[-tail:], tools=(tool,)), reader_name)
        if choice is None:
            grammar, triggers = fmt.call_grammar([tool], parallel=False), ()
        else:
            grammar, triggers = Bridge.held(plan_tools([tool], choice, fmt, parallel=False), reader)
        assert grammar is not None and backend.text.check_grammar(grammar) is None
        served = ServedAgents(backend)
        e = Engine(backend, EngineSettings(agents=2, ctx_per_agent=2048, check=True, reference=False),
                   agents=served)
        done: list[Finished] = []
        out: list[str] = []
        served.submit(ServedRequest(prompt=backend.text.tokenize(text), max_tokens=max_tokens,
                                    params=SamplingParams(temperature=1.0, seed=seed, grammar=grammar),
                                    emit=lambda ev: done.append(ev) if isinstance(ev, Finished)
                                    else out.append(ev.text)))
        for _ in range(steps):
            if done:
                break
            e.step()
        said = "".join(out)
        assert done and done[0].reason == "stop", said  # the grammar ended it, not max_tokens
        reply = reader.whole(said)
        name = tool["function"]["name"]
        assert len(reply.calls) == 1 and reply.calls[0].name == name, said
        jsonschema.validate(json.loads(reply.calls[0].arguments), tool["function"]["parameters"])
        return OneCall(renderer, text, grammar, triggers, said, reply)
    finally:
        backend.close()
