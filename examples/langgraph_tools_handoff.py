"""Two tool-using agents in LangGraph over `c2c serve`: the analyst calls tools, the writer goes on from its cache.

    bash scripts/setup.sh              # .venv, with the examples' extras (once)
    .venv/bin/c2c serve &              # Qwen2.5-Coder-0.5B-Instruct, which calls tools
    .venv/bin/python examples/langgraph_tools_handoff.py

Both agents are stock ``ChatOpenAI(...).bind_tools([read_log])``: one tool catalogue, which the
model's chat template writes into the system turn, so the two share a prefix. The analyst calls
``read_log`` once per service (``tool_choice`` names it: the reply is always a call), runs it,
sends the result back with the call's id, and answers; the server publishes the K/V of that whole
conversation, tool calls and results included, as a signed commit. The writer's request continues
the analyst's conversation and attaches the commit: the server loads the analyst's K/V and
prefills only the writer's own turn. A writer with another catalogue would have another prefix:
the commit is then read as text, and the record says why (``docs/serving.md``).
LangChain keeps no unknown reply fields, so the nodes read c2c's ``x-c2c-*`` headers.

Environment: C2C_BASE_URL (default http://127.0.0.1:8000/v1), C2C_API_KEY, C2C_MODEL
(default: the model the server serves).
"""

import os
from typing import TypedDict

from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from openai import OpenAI

BASE_URL = os.environ.get("C2C_BASE_URL", "http://127.0.0.1:8000/v1")
API_KEY = os.environ.get("C2C_API_KEY", "none")
MODEL = os.environ.get("C2C_MODEL") or OpenAI(base_url=BASE_URL, api_key=API_KEY).models.list().data[0].id
LOGS = {"api-1": "502 errors from 09:14 after deploy 7; rolled back to deploy 6 at 09:31.",
        "db-2": "replication lag 40 s at 09:20, recovered by 09:35."}


@tool
def read_log(service: str) -> str:
    """Read the newest lines of one service's log (api-1 or db-2)."""
    return LOGS.get(service, f"no log for {service}")


class State(TypedDict, total=False):
    conversation: list   # the analyst's messages, calls and answer: the writer's prompt begins with them
    commit: str          # the analyst's cache, by id
    calls: list          # the services the analyst's calls read
    handoff: str         # "<commit, 12 chars>:full" (its K/V were loaded) or ":text" (prefilled)
    answer: str


def model(c2c: dict | None = None, **kw) -> ChatOpenAI:
    return ChatOpenAI(base_url=BASE_URL, api_key=API_KEY, model=MODEL, temperature=0, max_tokens=48,
                      include_response_headers=True, extra_body={"c2c": c2c} if c2c else None).bind_tools(
        [read_log], **kw)


def analyst(state: State) -> State:
    messages, calls = [SystemMessage("You are the analyst of an incident team. Be brief.")], []
    for service in LOGS:
        messages.append(HumanMessage(f"Read the log of {service}."))
        reply = model(tool_choice="read_log").invoke(messages)        # a read_log call, always
        messages.append(reply)
        for call in reply.tool_calls:
            calls.append(call["args"].get("service"))
            messages.append(ToolMessage(read_log.invoke(call["args"]), tool_call_id=call["id"]))
    messages.append(HumanMessage("What happened, in one sentence?"))
    answer = model({"publish": {"stream": "example-langgraph-tools"}}, tool_choice="none").invoke(messages)
    return {"conversation": messages + [answer], "calls": calls,
            "commit": answer.response_metadata["headers"]["x-c2c-commit"]}


def writer(state: State) -> State:
    messages = state["conversation"] + [HumanMessage("Write a one-line status update for customers.")]
    reply = model({"attach": [state["commit"]], "mode": "auto"}, tool_choice="none").invoke(messages)
    return {"answer": reply.content, "handoff": reply.response_metadata["headers"]["x-c2c-handoffs"]}


def build():
    graph = StateGraph(State)
    graph.add_node("analyst", analyst)
    graph.add_node("writer", writer)
    graph.add_edge(START, "analyst")
    graph.add_edge("analyst", "writer")
    graph.add_edge("writer", END)
    return graph.compile()


if __name__ == "__main__":
    out = build().invoke({})
    print("calls:", ", ".join(str(c) for c in out["calls"]))
    print("commit:", out["commit"])
    print("handoff:", out["handoff"])
    print("writer:", out["answer"])
