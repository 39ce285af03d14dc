"""The asyncio side of a request: wait for its job, or stream it as server-sent events.

A worker job reports on a :class:`~c2c.serve.worker.Channel`. Here a request
either waits for the final result (while watching for the client to go away) or
is sent as SSE ``data: {chunk}`` lines ending in ``data: [DONE]``. A request
whose client disconnects, or that passes its deadline, has its job cancelled,
which stops the generation between two forward passes.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Callable

from c2c.errors import C2CError, RequestTimeoutError
from c2c.serve.http_errors import body, error_body
from c2c.serve.schema import chunk_body, usage
from c2c.serve.service import Completion, Reply, Started
from c2c.conversation.tools import held_back
from c2c.serve.worker import Channel, Job


class ClientGone(Exception):
    """The client disconnected; nothing is sent."""


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _next(job: Job, channel: Channel) -> tuple[str, Any]:
    remaining = job.deadline - time.monotonic()
    try:
        return await asyncio.wait_for(channel.get(), timeout=max(remaining, 0) + 1.0)  # the worker says it first
    except asyncio.TimeoutError:
        job.cancel.set()
        raise RequestTimeoutError(f"the request ran past its {job.timeout_s:g} s deadline") from None


async def _watch(receive: Callable, job: Job) -> None:
    """Cancel ``job`` when the client disconnects (the body was read already: the next message says so)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            job.cancel.set()
            return


async def _wait_for(want: str, job: Job, channel: Channel, receive: Callable):
    """The value of the job's first ``want`` event, watching for a disconnect meanwhile; its error is raised."""
    watcher = asyncio.create_task(_watch(receive, job))
    try:
        while True:
            kind, value = await _next(job, channel)
            if kind == want:
                return value
            if kind == "error":
                raise value
            if kind == "cancelled":
                raise ClientGone()
    finally:
        watcher.cancel()


async def until_ready(job: Job, channel: Channel, receive: Callable) -> Started:
    """Wait for the job to pass its checks (it may queue first); raise its error if it fails before that."""
    return await _wait_for("ready", job, channel, receive)


async def result(job: Job, channel: Channel, receive: Callable) -> Completion:
    """The job's :class:`Completion` (deltas are skipped); its error is raised."""
    try:
        return await _wait_for("done", job, channel, receive)
    finally:
        job.cancel.set()  # harmless once done; stops the job if we leave early (a timeout, a cancelled task)


async def chunks(job: Job, channel: Channel, started: Started, *, include_usage: bool,
                 logprobs: bool = False, tool_calls: bool = False) -> AsyncIterator[str]:
    """SSE lines of a streamed completion, from its first chunk to ``data: [DONE]``; each delta carries its
    tokens' log-probabilities when ``logprobs``, and its choice's index (``n > 1``).

    With ``tool_calls`` (the request has tools it may call) text that may be, or become, a call is held back
    (:func:`~c2c.conversation.tools.held_back`) until the reply is whole; then what is content is sent, and each call
    as OpenAI streams one: a delta ``{"tool_calls": [{"index", "id", "type", "function": {"name",
    "arguments"}}]}``, the finish reason ``tool_calls``.
    """
    opened, said, sent = {0}, {}, {}   # per choice: the text so far, and how much of it went out as content
    try:
        yield sse(chunk_body(started, delta={"role": "assistant", "content": ""}))
        while True:
            try:
                kind, value = await _next(job, channel)
            except C2CError as e:
                kind, value = "error", e
            if kind == "delta":
                index, delta = value
                if index and index not in opened:   # each choice opens with its role, as choice 0 did
                    opened.add(index)
                    yield sse(chunk_body(started, index=index, delta={"role": "assistant", "content": ""}))
                text = delta.text
                if tool_calls:
                    said[index] = whole = said.get(index, "") + delta.text
                    upto = len(whole) - held_back(whole)
                    text = whole[sent.get(index, 0):upto] if upto > sent.get(index, 0) else ""
                    sent[index] = max(upto, sent.get(index, 0))
                    if not text:
                        continue
                yield sse(chunk_body(started, index=index, delta={"content": text},
                                     logprobs=delta.logprobs if logprobs else None))
            elif kind == "done":
                last = len(value.replies) - 1
                for i, reply in enumerate(value.replies):   # the last choice's finish chunk carries the c2c record
                    if tool_calls:
                        for d in _rest(reply, said.get(i, ""), sent.get(i, 0)):
                            yield sse(chunk_body(started, index=i, delta=d))
                    yield sse(chunk_body(started, index=i, finish_reason=reply.finish_reason,
                                         extra={"c2c": value.c2c} if i == last else None))
                if include_usage:
                    yield sse(chunk_body(started, choices=False, extra={"usage": usage(value)}))
                break
            elif kind == "error":
                yield sse(error_body(value)[1] if isinstance(value, C2CError) else
                          body("internal error; see the server log", 500, "internal_error"))
                break
            elif kind == "cancelled":
                return
        yield "data: [DONE]\n\n"
    finally:
        job.cancel.set()  # the client left mid-stream (or we are done): stop generating


def _rest(reply: Reply, said: str, sent: int) -> list[dict[str, Any]]:
    """The deltas a held-back reply still owes: the content not sent yet, then one delta per tool call."""
    out: list[dict[str, Any]] = []
    content, gone = reply.text, said[:sent]
    if reply.tool_calls:
        more = content[len(gone):] if content.startswith(gone) else ""
    else:   # not a call after all: all of it is content
        more = said[sent:]
    if more:
        out.append({"content": more})
    for k, c in enumerate(reply.tool_calls):
        out.append({"tool_calls": [{"index": k, **c.to_dict()}]})
    return out
