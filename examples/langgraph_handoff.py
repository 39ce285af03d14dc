"""Analyst -> writer as a LangGraph graph over `c2c serve` or `vllm serve`: the analyst's KV cache travels by id.

    bash scripts/setup.sh              # .venv, with the examples' extras (once)
    .venv/bin/c2c serve &
    .venv/bin/python examples/langgraph_handoff.py

The same script runs unchanged against vLLM with c2c's connector (docs/vllm.md gives the
server command): only C2C_BASE_URL changes.

Each node is a stock ``ChatOpenAI(base_url=...)``. The analyst reads the evidence and
answers; the server publishes the K/V of that conversation as a signed commit, and only
its id (with the conversation) goes into the graph state. The writer's request continues
the analyst's conversation and attaches the commit: the server loads the analyst's K/V and
prefills only the writer's own turn (or, where a check fails, prefills it all and says why).
LangChain keeps no unknown reply fields, so the nodes read c2c's ``x-c2c-*`` headers.

Environment: C2C_BASE_URL (default http://127.0.0.1:8000/v1), C2C_API_KEY, C2C_MODEL
(default: the model the server serves).
"""

import os
from typing import TypedDict

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from openai import OpenAI

BASE_URL = os.environ.get("C2C_BASE_URL", "http://127.0.0.1:8000/v1")
API_KEY = os.environ.get("C2C_API_KEY", "none")
MODEL = os.environ.get("C2C_MODEL") or OpenAI(base_url=BASE_URL, api_key=API_KEY).models.list().data[0].id
SYSTEM = "You are one agent of a two-agent incident team. Be brief."


class State(TypedDict, total=False):
    evidence: str
    conversation: list   # the analyst's messages and answer: the writer's prompt begins with them
    commit: str          # the analyst's cache, by id
    handoff: str         # "<commit, 12 chars>:full" (its K/V were loaded) or ":text" (prefilled)
    answer: str


def chat(c2c: dict) -> ChatOpenAI:
    return ChatOpenAI(base_url=BASE_URL, api_key=API_KEY, model=MODEL, temperature=0, max_tokens=32,
                      include_response_headers=True, extra_body={"c2c": c2c})


def analyst(state: State) -> State:
    messages = [("system", SYSTEM), ("user", f"Evidence: {state['evidence']}\nWhat happened, in one sentence?")]
    reply = chat({"publish": {"stream": "example-langgraph-notes"}}).invoke(messages)
    return {"conversation": messages + [("assistant", reply.content)],
            "commit": reply.response_metadata["headers"]["x-c2c-commit"]}


def writer(state: State) -> State:
    messages = state["conversation"] + [("user", "Write a one-line status update for customers.")]
    reply = chat({"attach": [state["commit"]], "mode": "auto"}).invoke(messages)
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
    out = build().invoke({"evidence": "At 09:14 deploy 7 broke the API; it was rolled back at 09:31."})
    print("commit:", out["commit"])
    print("handoff:", out["handoff"])
    print("writer:", out["answer"])
