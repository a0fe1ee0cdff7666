"""What every serving API (OpenAI's chat and completions, Anthropic's messages, OpenAI's responses) does
alike: render the conversation with the model's template, check the prompt against an agent's context,
plan the tools and the grammar, queue the request, and read its reply back from the engine's thread.

An API module turns its own body into these calls and the reply into its own shape; none of them knows
another's."""

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request

from swarmtune.engine.agents.prompt import PromptRenderer
from swarmtune.engine.agents.served import ServedAgents
from swarmtune.engine.agents.served_request import Closed, Delta, Finished, ServedRequest
from swarmtune.engine.conversation.chat_message import ChatMessage
from swarmtune.engine.conversation.formats.base import Format
from swarmtune.engine.conversation.formats.grammar import hold
from swarmtune.engine.conversation.formats.reader import ReplyReader
from swarmtune.engine.conversation.formats.reply import ReplyContext
from swarmtune.engine.conversation.sampling import SamplingParams
from swarmtune.engine.conversation.tool_calls import json_grammar
from swarmtune.engine.errors import UserError
from swarmtune.server.openai_schema import BadRequest
from swarmtune.server.outbox import Outbox
from swarmtune.server.runner import EngineRunner

AGENT_HEADER = "x-swarmtune-agent"  # pins a conversation to an agent, as a body's user field does
TAIL_CHARS = 256  # of a rendered prompt, kept to read where it left the reply (a generation prompt is shorter)


def overflow_message(endpoint: str, prompt: int, ctx: int, limit: int | None = None, limit_param: str = "") -> str:
    """A prompt (or a prompt and its limit) past an agent's context, in the words the API's own server uses,
    which the agents parse to compact or shorten (docs/serving.md, a full context): Anthropic's for its
    Messages, OpenAI's for the rest. The most a prompt holds is the context less one generated token and
    its end."""
    most = ctx - 2
    if endpoint == "messages":
        if limit is None:
            return f"prompt is too long: {prompt} tokens > {most} maximum"
        return (f"input length and `max_tokens` exceed context limit: {prompt} + {limit} > {most}, decrease input "
                "length or `max_tokens` and try again")
    if limit is None:
        return (f"This model's maximum context length is {most} tokens. However, your messages resulted in {prompt} "
                "tokens. Please reduce the length of the messages. (swarmtune: an agent's context, --ctx)")
    return (f"This model's maximum context length is {most} tokens. However, you requested {prompt + limit} tokens "
            f"({prompt} in the messages, {limit} in the completion: {limit_param}). Please reduce the length of the "
            "messages or completion. (swarmtune: an agent's context, --ctx)")


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools and output format make of its prompt, its sampling and its reply."""

    offered: list[dict[str, Any]] | None  # the tools the prompt shows (OpenAI's shape)
    grammar: str | None  # what sampling keeps to
    names: set[str] | None  # the functions a call may name
    parse: bool  # whether the reply is read for calls
    parallel: bool = True
    triggers: tuple[str, ...] = ()  # the grammar holds from where one matches (lazy, under auto); (): throughout
    forced: bool = False  # a call from the reply's first token (required, a named function)


def plan_tools(tools: list[dict[str, Any]], choice: str, fmt: Format, parallel: bool = True,
               json_schema: dict[str, Any] | None = None, json_output: bool = False) -> ToolPlan:
    """choice: auto | none | required | the name of the one function to call. json_output: the reply is a
    JSON object (json_schema: one that validates). A call is held in the family's own shape: from the first
    token (required, a name), or lazily from where the model begins one (auto)."""
    try:
        grammar = json_grammar(json_schema) if json_output else None
        if not tools or choice == "none":
            if choice not in ("auto", "none"):
                raise BadRequest("tool_choice asks for a call, but the request has no tools", "tool_choice")
            return ToolPlan(None, grammar, None, False)
        names = {t["function"]["name"] for t in tools}
        if choice != "auto":
            if choice != "required" and choice not in names:
                raise BadRequest(f"tool_choice names {choice!r}, which is not among the tools", "tool_choice")
            chosen = tools if choice == "required" else [t for t in tools if t["function"]["name"] == choice]
            many = parallel and choice == "required"
            held = _call_grammar(fmt, chosen, many)
            if held is None:
                raise BadRequest(f"tool_choice {choice!r} needs a call grammar, and swarmtune writes none for "
                                 f"{fmt.name}", "tool_choice")
            return ToolPlan(tools, held, set(names) if choice == "required" else {choice}, True, many, forced=True)
        if grammar is None and (triggers := fmt.triggers()):
            try:
                own = _call_grammar(fmt, tools, parallel)
            except UserError:  # a schema no grammar expresses: under auto the call is read, not held
                own = None
            if own is not None:
                return ToolPlan(tools, own, names, True, parallel, triggers)
        return ToolPlan(tools, grammar, names, True, parallel)
    except UserError as e:  # a schema the grammar cannot express
        raise BadRequest(str(e), e.field) from None


def _call_grammar(fmt: Format, tools: list[dict[str, Any]], parallel: bool) -> str | None:
    """The family's call grammar; a tool schema its builder chokes on (a draft-3 `"required": true`, a
    `minItems` that is no number) is the client's error, said in one line, not a 500."""
    try:
        return fmt.call_grammar(tools, parallel)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise UserError(f"a tool's parameters schema cannot be enforced: {type(e).__name__}: {e}"[:200],
                        field="tools") from None


def template_variables(kwargs: dict[str, Any] | None, effort: str | None = None, thinking: bool | None = None,
                       param: str = "chat_template_kwargs") -> dict[str, Any]:
    """What a request adds to its template's context, as llama-server adds it: `chat_template_kwargs` as they
    came, `reasoning_effort` (and "none" as thinking off), and an API's own switch for thinking (Anthropic's
    `thinking`). A template that reads none of them renders as without; a switch of the wrong type is a 400."""
    out = dict(kwargs or {})
    if "enable_thinking" in out and not isinstance(out["enable_thinking"], bool):
        raise BadRequest(f"{param}.enable_thinking must be a boolean (got {json.dumps(out['enable_thinking'])[:40]})",
                         f"{param}.enable_thinking")
    if effort is not None:
        out.setdefault("reasoning_effort", effort)
        if effort == "none":
            out.setdefault("enable_thinking", False)
    if thinking is not None:
        out.setdefault("enable_thinking", thinking)
    return out


def model_id(path: str) -> str:
    """What /v1/models calls the loaded model: its file's name, as llama-server names it by default."""
    return Path(path).name if path else "swarmtune"


@dataclass(frozen=True)
class Sampling:
    """A body's sampling fields; None: llama-server's default, which its users' agents are tuned on."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    ignore_eos: bool = False  # an extension, as llama-server and vLLM take it

    def params(self, grammar: str | None, triggers: tuple[str, ...] = ()) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature if self.temperature is not None else 0.8,
            top_k=self.top_k if self.top_k is not None else 40,
            top_p=self.top_p if self.top_p is not None else 0.95,
            min_p=self.min_p if self.min_p is not None else 0.05,
            seed=self.seed if self.seed is not None else time.monotonic_ns() & 0x7FFFFFFF,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            grammar=grammar,
            grammar_triggers=triggers,
            ignore_eos=self.ignore_eos,
        )


@dataclass(frozen=True)
class ChatConfig:
    """How the server renders chats and reads replies, for every API alike."""

    trim_front: bool = False  # --on-overflow trim-front: drop a prompt's oldest messages until it fits
    reasoning: bool = True  # --reasoning-format auto (False: none, the reasoning stays in the content)
    template: str | None = None  # --chat-template-file's text, over the GGUF's own


class RenderedPrompt(list[int]):
    """A chat prompt's tokens, and where its system prompt ends in them (0: no system prompt, or unknown);
    where --on-overflow trim-front dropped its oldest messages to fit, how many and their tokens; the end of
    its text, which says whether the reply starts inside a thinking block."""

    system_tokens: int = 0
    text_end: str = ""
    trimmed_messages: int = 0
    trimmed_tokens: int = 0


MIN_REPLY_TOKENS = 16  # trim-front without a stated limit leaves room for at least this much of a reply


def drop_oldest(messages: list[ChatMessage]) -> list[ChatMessage] | None:
    """The conversation less its oldest turn (the first message after the system prompt, with the tool
    results that answer it, and an assistant message left leading), so that the template still sees a
    well-formed conversation; None where only the system prompt and the last message are left."""
    head = 1 if messages and messages[0]["role"] == "system" else 0
    rest = messages[head:]
    if len(rest) <= 1:
        return None
    n = 1
    while n < len(rest) - 1 and rest[n]["role"] in ("tool", "assistant"):
        n += 1  # its tool results, and a reply that no longer follows a user's message
    return messages[:head] + rest[n:]


class Bridge:
    def __init__(self, runner: EngineRunner, served: ServedAgents, chat: ChatConfig = ChatConfig()) -> None:
        self.runner, self.served, self.chat = runner, served, chat
        self.trim_front = chat.trim_front
        self.backend = runner.engine.backend
        self.renderer = PromptRenderer(self.backend, chat.template)
        self.model = model_id(runner.engine.facts.path)
        self.created = int(time.time())
        self._outbox: Outbox | None = None  # the server loop's, made by the first request

    @property
    def fmt(self) -> Format:
        return self.renderer.picked.fmt

    def reader(self, plan: "ToolPlan", prompt: "RenderedPrompt") -> ReplyReader:
        """How this request's reply is read: the model's format, the request's tools, where its prompt left
        the reply."""
        ctx = ReplyContext(prompt_tail=prompt.text_end, reasoning=self.chat.reasoning, tools=tuple(plan.offered or ()),
                           calls=plan.parse)
        return ReplyReader(self.renderer.picked.fmt, ctx, self.renderer.picked.label)

    @staticmethod
    def held(plan: "ToolPlan", reader: ReplyReader) -> tuple[str | None, tuple[str, ...]]:
        """What sampling keeps to, and from where, once the prompt is known (formats/grammar.py hold)."""
        if plan.grammar is None or not plan.parse:
            return plan.grammar, plan.triggers
        return hold(reader.fmt, reader.ctx, plan.grammar, plan.triggers, plan.forced)

    async def prompt(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None,
                     param: str = "messages", limit: int | None = None,
                     variables: dict[str, Any] | None = None) -> "RenderedPrompt":
        """The conversation rendered and tokenized; under trim-front, less its oldest turns until it and its
        limit (or a short reply) fit an agent's context. Nothing is dropped silently: the response says
        what was (bridge.account). variables: the template's additions (thinking, effort, kwargs)."""
        out = await self._rendered(messages, tools, param, variables)
        if not self.trim_front:
            return out
        fits = self.runner.engine.s.ctx_per_agent - 2 - (limit if limit is not None else MIN_REPLY_TOKENS)
        whole, dropped = len(out), 0
        while len(out) > fits and (fewer := drop_oldest(messages)) is not None:
            dropped += len(messages) - len(fewer)
            messages = fewer
            out = await self._rendered(messages, tools, param, variables)
        out.trimmed_messages, out.trimmed_tokens = dropped, whole - len(out)
        return out

    def render(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None, param: str = "messages",
               variables: dict[str, Any] | None = None) -> str:
        try:
            return self.renderer.render(messages, tools, variables)
        except UserError as e:
            raise BadRequest(str(e), param) from None

    async def _rendered(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None,
                        param: str, variables: dict[str, Any] | None = None) -> "RenderedPrompt":
        text = self.render(messages, tools, param, variables)
        return await asyncio.to_thread(self._tokenized, text, messages)

    def _tokenized(self, text: str, messages: list[ChatMessage]) -> "RenderedPrompt":
        out = RenderedPrompt(self.backend.text.tokenize(text))
        out.text_end = text[-TAIL_CHARS:]
        content = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
        if isinstance(content, str) and content and (at := text.find(content)) >= 0:
            # where the system prompt ends, in tokens: a miss before it is said to be the system prompt's
            out.system_tokens = len(self.backend.text.tokenize(text[: at + len(content)]))
        return out

    async def tokenize(self, text: str) -> list[int]:
        return await asyncio.to_thread(self.backend.text.tokenize, text)

    def request(self, prompt: list[int], limit: int | None, sampling: Sampling, stop: tuple[str, ...],
                key: str | None, endpoint: str, grammar: str | None = None, triggers: tuple[str, ...] = (),
                prompt_param: str = "messages", limit_param: str = "max_tokens",
                reader: ReplyReader | None = None) -> ServedRequest:
        """The request, checked: a prompt that fits an agent's context, a limit that fits after it."""
        ctx = self.runner.engine.s.ctx_per_agent
        if not prompt:
            raise BadRequest("the prompt is empty", prompt_param)
        if len(prompt) + 2 > ctx:
            raise BadRequest(overflow_message(endpoint, len(prompt), ctx), prompt_param, code="context_length_exceeded")
        room = ctx - 2 - len(prompt)
        if limit is not None and limit > room:
            raise BadRequest(overflow_message(endpoint, len(prompt), ctx, limit, limit_param), limit_param,
                             code="context_length_exceeded")
        if grammar is not None and (why := self.backend.text.check_grammar(grammar)) is not None:
            raise BadRequest(f"the output cannot be constrained: {why}", "tools")
        return ServedRequest(prompt=prompt, max_tokens=limit if limit is not None else room,
                             params=sampling.params(grammar, triggers), stop=stop, key=key, endpoint=endpoint,
                             system_tokens=getattr(prompt, "system_tokens", 0), reader=reader,
                             trimmed=(getattr(prompt, "trimmed_messages", 0), getattr(prompt, "trimmed_tokens", 0)))

    def submit(self, req: ServedRequest) -> asyncio.Queue[Delta | Finished | Closed]:
        """Queue it; its events arrive on the returned queue. Raises Busy (the queue is full)."""
        if self.runner.error:
            raise BadRequest(f"the engine stopped: {self.runner.error}", status=503, code="engine_stopped")
        loop = asyncio.get_running_loop()
        if self._outbox is None or self._outbox.loop is not loop:
            self._outbox = self.runner.outbox_for(loop)
        outbox = self._outbox
        q: asyncio.Queue[Delta | Finished | Closed] = asyncio.Queue()

        def emit(event: Delta | Finished | Closed) -> None:
            try:
                outbox.put(q, event)
            except RuntimeError:  # the server's loop is gone (shutting down): nobody is listening
                pass

        req.emit = emit
        self.served.submit(req)
        return q

    async def collect(self, request: Request, req: ServedRequest,
                      q: asyncio.Queue[Delta | Finished | Closed]) -> tuple[str, Finished] | Closed | None:
        """The whole reply; Closed if the server stops first; None if the client left first (then the
        request is cancelled)."""
        parts: list[str] = []
        while True:
            try:
                ev = await asyncio.wait_for(q.get(), timeout=1.0)
            except TimeoutError:
                if await request.is_disconnected():
                    self.served.cancel(req)
                    return None
                continue
            if isinstance(ev, Delta):
                parts.append(ev.text)
            elif isinstance(ev, Closed):
                return ev
            else:
                return "".join(parts), ev

    async def events(self, req: ServedRequest,
                     q: asyncio.Queue[Delta | Finished | Closed]) -> AsyncIterator[Delta | Finished | Closed]:
        """The reply as it comes; the request is cancelled if the client leaves before its end."""
        done = False
        try:
            while True:
                ev = await q.get()
                yield ev
                if isinstance(ev, Finished | Closed):
                    done = True
                    return
        finally:
            if not done:
                self.served.cancel(req)


def account(req: ServedRequest) -> dict[str, Any]:
    """An extension beside `usage` (as llama-server adds `timings`): what the request's prompt reused and,
    where it prefilled what its conversation had held, why (docs/serving.md#why-a-turn-missed-its-cache)."""
    m = req.miss
    return {"agent": req.agent, "cached_tokens": req.cached_tokens, "copied_tokens": req.copied_tokens,
            "copied_from": req.copied_from, "shifted_tokens": req.shifted_tokens,
            "prefilled_tokens": req.prefilled_tokens,
            "miss": None if m is None else {"at": m.at, "cause": m.cause, "words": m.words, "old": m.old,
                                            "new": m.new},
            # --on-overflow trim-front: the oldest messages dropped for the prompt to fit, and their tokens
            **({"trimmed": {"messages": req.trimmed[0], "tokens": req.trimmed[1]}} if req.trimmed[0] else {})}
