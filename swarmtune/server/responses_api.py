"""OpenAI's Responses API over the served agents (what Codex CLI speaks): POST /v1/responses, streamed or
not, with `input` (a string or items), `instructions`, function `tools` and `previous_response_id`.

A response's id maps to its conversation (every item so far and its output), so a request naming it
continues that conversation, and, its prompt beginning with the agent's history, the same agent and its
cells. The map keeps the latest RESPONSES_KEPT responses; an id it no longer holds, or never did, is a
400 that says so."""

import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from swarmtune.engine.agents.served_request import Busy, Closed, Delta, Finished
from swarmtune.engine.conversation.chat_message import ChatMessage
from swarmtune.engine.conversation.formats.reply import Reply, ToolCall
from swarmtune.server.bridge import AGENT_HEADER, Bridge, Sampling, account, plan_tools, template_variables
from swarmtune.server.openai_api import busy_response, whole_reply
from swarmtune.server.openai_schema import BadRequest, error_body, error_response, parse_json, validated

RESPONSES_KEPT = 4096


class InputText(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["input_text", "output_text", "text"]
    text: str


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function_call_output"]
    call_id: str
    output: str


class ReasoningText(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(BaseModel):
    """An earlier response's reasoning, sent back in `input` (as Codex sends it)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["reasoning"]
    id: str = ""
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None

    def text(self) -> str:
        return "".join(p.text for p in (self.content or self.summary))


class ReasoningConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class NamedFunctionChoice(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["function"]
    name: str


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    input: str | list[Annotated[MessageItem | FunctionCallItem | FunctionOutputItem | ReasoningItem,
                                Field(union_mode="left_to_right")]]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    previous_response_id: str | None = None
    stream: bool = False
    user: str | None = None
    store: bool = True
    reasoning: ReasoningConfig | None = None


def _items(body: ResponsesRequest) -> list[ChatMessage]:
    """The request's input as engine/agents/prompt.py's messages. A reasoning item opens the assistant turn
    whose text and calls follow it, as a response's output lists them."""
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    out: list[ChatMessage] = []

    def open_turn() -> bool:  # the last message is an assistant turn with nothing but reasoning yet
        return bool(out) and out[-1]["role"] == "assistant" and not out[-1]["content"] and \
            not out[-1].get("tool_calls")

    for it in body.input:
        if isinstance(it, ReasoningItem):
            if open_turn():
                out[-1]["reasoning"] = out[-1].get("reasoning", "") + it.text()
            else:
                out.append({"role": "assistant", "content": "", "reasoning": it.text()})
        elif isinstance(it, MessageItem):
            if it.role == "assistant" and open_turn():
                out[-1]["content"] = it.text()
            else:
                out.append({"role": "system" if it.role == "developer" else it.role, "content": it.text()})
        elif isinstance(it, FunctionCallItem):
            call = ToolCall(it.name, it.arguments, it.call_id)
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            out.append({"role": "tool", "content": it.output, "tool_call_id": it.call_id})
    return out


def add_responses_routes(app: FastAPI, bridge: Bridge) -> None:
    kept: OrderedDict[str, list[ChatMessage]] = OrderedDict()  # response id -> its conversation, with output

    def keep(rid: str, conversation: list[ChatMessage]) -> None:
        kept[rid] = conversation
        while len(kept) > RESPONSES_KEPT:
            kept.popitem(last=False)

    @app.post("/v1/responses", summary="OpenAI Responses: each conversation is an agent", response_class=Response)
    async def responses(request: Request) -> Response:
        try:
            body = validated(ResponsesRequest, parse_json(await request.body()))
            history: list[ChatMessage] = []
            if body.previous_response_id is not None:
                if body.previous_response_id not in kept:
                    raise BadRequest(f"previous_response_id {body.previous_response_id!r} is unknown here: never "
                                     f"made, or past the {RESPONSES_KEPT} responses this server keeps",
                                     "previous_response_id", code="previous_response_not_found")
                history = [m for m in kept[body.previous_response_id] if m["role"] != "system"]
            messages = history + _items(body)
            if body.instructions:  # instructions are the request's own: they do not carry over
                messages = [{"role": "system", "content": body.instructions}, *messages]
            if not messages:
                raise BadRequest("input is empty", "input")
            tc = body.tool_choice
            choice = tc.name if isinstance(tc, NamedFunctionChoice) else (tc or "auto")
            tools = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                     for t in body.tools or []]
            p = plan_tools(tools, choice, bridge.fmt, body.parallel_tool_calls)
            variables = template_variables(None, body.reasoning.effort if body.reasoning else None)
            prompt = await bridge.prompt(messages, p.offered, "input", limit=body.max_output_tokens,
                                         variables=variables)
            reader = bridge.reader(p, prompt)
            key = request.headers.get(AGENT_HEADER) or body.user or None
            req = bridge.request(prompt, body.max_output_tokens, Sampling(body.temperature, body.top_p), (), key,
                                 "responses", *bridge.held(p, reader), "input", "max_output_tokens",
                                 reader=reader)
            q = bridge.submit(req)
        except BadRequest as e:
            return error_response(e)
        except Busy as e:
            return busy_response(e)
        rid, created = f"resp_{req.id}", int(time.time())

        def response(status: str, output: list[dict[str, Any]], fin: Finished | None) -> dict[str, Any]:
            usage = None
            if fin is not None:
                u = fin.usage
                usage = {"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens,
                         "total_tokens": u.prompt_tokens + u.completion_tokens,
                         "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
                         "output_tokens_details": {"reasoning_tokens": 0}}
            incomplete = {"reason": "max_output_tokens"} if fin is not None and fin.reason == "length" else None
            return {"id": rid, "object": "response", "created_at": created, "model": bridge.model,
                    "status": "incomplete" if incomplete else status, "incomplete_details": incomplete,
                    "output": output, "usage": usage, "previous_response_id": body.previous_response_id,
                    "instructions": body.instructions, "tools": [t.model_dump() for t in body.tools or []],
                    "tool_choice": body.tool_choice if isinstance(body.tool_choice, str) else "auto",
                    "parallel_tool_calls": body.parallel_tool_calls, "temperature": body.temperature,
                    "top_p": body.top_p, "max_output_tokens": body.max_output_tokens, "error": None,
                    "metadata": {}, "text": {"format": {"type": "text"}}, "store": body.store,
                    **({"swarmtune": account(req)} if fin is not None else {})}

        mid, rsid = f"msg_{req.id}", f"rs_{req.id}"

        def reasoning_item(text: str) -> dict[str, Any]:
            return {"type": "reasoning", "id": rsid, "status": "completed", "summary": [],
                    "content": [{"type": "reasoning_text", "text": text}]}

        def message_item(text: str) -> dict[str, Any]:
            return {"type": "message", "id": mid, "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}

        def call_item(c: ToolCall) -> dict[str, Any]:
            return {"type": "function_call", "id": f"fc_{c.id.removeprefix('call_')}", "call_id": c.id,
                    "name": c.name, "arguments": c.arguments, "status": "completed"}

        def output_of(r: Reply) -> list[dict[str, Any]]:
            return ([reasoning_item(r.reasoning)] if r.reasoning else []) + (
                [message_item(r.content)] if r.content else []) + [call_item(c) for c in r.calls]

        def remember(r: Reply) -> None:
            reply: ChatMessage = {"role": "assistant", "content": r.content}
            if r.calls:
                reply["tool_calls"] = list(r.calls)
            if r.reasoning:
                reply["reasoning"] = r.reasoning
            keep(rid, [m for m in messages if m["role"] != "system" or not body.instructions] + [reply])

        if not body.stream:
            got = await whole_reply(bridge, request, req, q)
            if isinstance(got, Response):
                return got
            text, fin = got
            whole = reader.whole(text)
            remember(whole)
            return JSONResponse(response("completed", output_of(whole), fin))

        async def stream() -> AsyncIterator[bytes]:
            seq = 0

            def event(kind: str, **data: Any) -> bytes:
                nonlocal seq
                seq += 1
                return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': seq, **data})}\n\n".encode()

            class Items:
                """The output items as they stream: an item opened on its first delta and done when the next
                kind begins, each with an id and text of its own (a reasoning item after a message is a new
                item); response.completed lists them as they went out."""

                def __init__(self) -> None:
                    self.index, self.open, self.text = 0, "", ""
                    self.done: list[dict[str, Any]] = []

                def _id(self) -> str:
                    return f"{'rs' if self.open == 'reasoning' else 'msg'}_{req.id}_{self.index}"

                def start(self, kind: str) -> bytes:
                    out = self.close()
                    self.open, self.text = kind, ""
                    if kind == "reasoning":
                        return out + event("response.output_item.added", output_index=self.index, item={
                            "type": "reasoning", "id": self._id(), "status": "in_progress", "summary": [],
                            "content": []}) + event(
                            "response.content_part.added", item_id=self._id(), output_index=self.index,
                            content_index=0, part={"type": "reasoning_text", "text": ""})
                    return out + event("response.output_item.added", output_index=self.index, item={
                        "type": "message", "id": self._id(), "status": "in_progress", "role": "assistant",
                        "content": []}) + event(
                        "response.content_part.added", item_id=self._id(), output_index=self.index, content_index=0,
                        part={"type": "output_text", "text": "", "annotations": []})

                def close(self) -> bytes:
                    if not self.open:
                        return b""
                    iid = self._id()
                    if self.open == "reasoning":
                        item = {**reasoning_item(self.text), "id": iid}
                        part = item["content"][0]
                        out = event("response.reasoning_text.done", item_id=iid, output_index=self.index,
                                    content_index=0, text=self.text)
                    else:
                        item = {**message_item(self.text), "id": iid}
                        part = item["content"][0]
                        out = event("response.output_text.done", item_id=iid, output_index=self.index,
                                    content_index=0, text=self.text, logprobs=[])
                    out += event("response.content_part.done", item_id=iid, output_index=self.index, content_index=0,
                                 part=part)
                    out += event("response.output_item.done", output_index=self.index, item=item)
                    self.done.append(item)
                    self.open, self.index = "", self.index + 1
                    return out

                def delta(self, d: Reply) -> bytes:
                    out = b""
                    if d.reasoning:
                        out += self.start("reasoning") if self.open != "reasoning" else b""
                        self.text += d.reasoning
                        out += event("response.reasoning_text.delta", item_id=self._id(), output_index=self.index,
                                     content_index=0, delta=d.reasoning)
                    if d.content:
                        out += self.start("message") if self.open != "message" else b""
                        self.text += d.content
                        out += event("response.output_text.delta", item_id=self._id(), output_index=self.index,
                                     content_index=0, delta=d.content, logprobs=[])
                    for c in d.calls:
                        out += self.close()
                        item = call_item(c)
                        out += event("response.output_item.added", output_index=self.index,
                                     item={**item, "arguments": "", "status": "in_progress"})
                        out += event("response.function_call_arguments.delta", item_id=item["id"],
                                     output_index=self.index, delta=c.arguments)
                        out += event("response.function_call_arguments.done", item_id=item["id"],
                                     output_index=self.index, arguments=c.arguments)
                        out += event("response.output_item.done", output_index=self.index, item=item)
                        self.done.append(item)
                        self.index += 1
                    return out

            yield event("response.created", response=response("in_progress", [], None))
            yield event("response.in_progress", response=response("in_progress", [], None))
            reply, items = reader.stream(), Items()
            async for ev in bridge.events(req, q):
                if isinstance(ev, Delta):
                    if out := items.delta(reply.feed(ev.text)):
                        yield out
                elif isinstance(ev, Closed):
                    yield f"event: error\ndata: {json.dumps(error_body(ev.message, 'server_error'))}\n\n".encode()
                else:
                    yield items.delta(reply.finish()) + items.close()
                    remember(reply.result())
                    yield event("response.completed", response=response("completed", items.done, ev))

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
