"""Tool calls per model family on tiny random-weight GGUFs that carry the families' chat templates (the
structure of Qwen 2.5's, Llama 3.1's and Mistral's own): the prompt renders through the template, and a
call sampled under the grammar parses and validates, even from random weights."""

import json

import jsonschema
import pytest

from swarmtune.engine.agents.prompt import PromptRenderer
from swarmtune.engine.agents.served import ServedAgents
from swarmtune.engine.agents.served_request import Finished, ServedRequest
from swarmtune.engine.backends.llama_backend import LlamaBackend
from swarmtune.engine.conversation.formats.reader import ReplyReader
from swarmtune.engine.conversation.formats.reply import ReplyContext
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.engine import Engine
from swarmtune.engine.model.model_facts import read_model_facts
from swarmtune.engine.settings import EngineSettings
from tests.tiny_gguf import llama_dense

QWEN = ("{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
        "</tools>\nFor each function call, return <tool_call></tool_call> XML tags.<|im_end|>\n{% endif %}"
        "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
        "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% for c in m.tool_calls or [] %}\n<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
        "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3 = ("{{ bos_token }}{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nRespond with a JSON function "
          "call {\"name\": ..., \"parameters\": ...}.{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|eot_id|>"
          "{% endif %}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}"
          "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
          "{% endif %}")
MISTRAL = ("{{ bos_token }}{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
           "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]{% elif m.tool_calls %}"
           "[TOOL_CALLS]{{ m.tool_calls | tojson }}{% else %}{{ m.content }}{% endif %}{% endfor %}")
# enums: random weights would write a free string until max_tokens; a grammar cannot make them stop
TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"enum": ["a.py", "b.py", "setup.cfg"]}, "whole": {"type": "boolean"}},
    "required": ["path", "whole"]}}}


@pytest.mark.parametrize(("fam", "template"), [("qwen3-hermes", QWEN), ("llama", LLAMA3), ("mistral", MISTRAL)])
def test_a_random_model_under_the_grammar_makes_a_call_that_validates(tmp_path, fam, template):
    path = llama_dense(tmp_path / f"{fam}.gguf", template)
    backend = LlamaBackend(read_model_facts(path), n_threads=1)
    try:
        renderer = PromptRenderer(backend)
        assert renderer.family == fam and renderer.template is not None and renderer.template.knows_tools
        text = renderer.render([{"role": "user", "content": "read a file"}], [TOOL])
        assert "read_file" in text  # the template offered the tool
        served = ServedAgents(backend)
        e = Engine(backend, EngineSettings(agents=2, ctx_per_agent=1024, check=True, reference=False),
                   agents=served)
        grammar = renderer.picked.fmt.call_grammar([TOOL], parallel=False)
        assert grammar is not None
        assert backend.text.check_grammar(grammar) is None
        done: list[Finished] = []
        out: list[str] = []
        req = ServedRequest(prompt=backend.text.tokenize(text), max_tokens=200,
                            params=SamplingParams(temperature=1.0, seed=3, grammar=grammar),
                            emit=lambda ev: done.append(ev) if isinstance(ev, Finished) else out.append(ev.text))
        served.submit(req)
        for _ in range(400):
            if done:
                break
            e.step()
        assert done and done[0].reason == "stop"  # the grammar ended it, not max_tokens
        reply = ReplyReader(renderer.picked.fmt, ReplyContext(tools=(TOOL,)), fam).whole("".join(out))
        calls = reply.calls
        assert len(calls) == 1 and calls[0].name == "read_file"
        jsonschema.validate(json.loads(calls[0].arguments), TOOL["function"]["parameters"])
    finally:
        backend.close()
