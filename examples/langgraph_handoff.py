"""Analyst -> writer as a LangGraph graph over `c2c serve`: the analyst's KV cache travels by commit id.

    bash scripts/setup.sh              # .venv, with the examples' extras (once)
    .venv/bin/c2c serve &
    .venv/bin/python examples/langgraph_handoff.py

Each node is a stock ``ChatOpenAI(base_url=...)``. The analyst publishes its cache
to the server's store; only the commit id goes into the graph state; the writer
attaches it and continues from the analyst's cache (or, where a check fails, from
its text), without re-reading what the analyst read. LangChain keeps no unknown
response fields, so the nodes read the server's ``x-c2c-*`` response headers.

Environment: C2C_BASE_URL (default http://127.0.0.1:8000/v1), C2C_API_KEY, C2C_MODEL.
"""

import os
import uuid
from typing import TypedDict

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

RUN = uuid.uuid4().hex[:8]  # this run's own sessions: a rerun starts fresh

BASE_URL = os.environ.get("C2C_BASE_URL", "http://127.0.0.1:8000/v1")
API_KEY = os.environ.get("C2C_API_KEY", "none")
MODEL = os.environ.get("C2C_MODEL", "Qwen2.5-Coder-0.5B-Instruct")
SYSTEM = "You are one agent of a two-agent incident team. Be brief."


class State(TypedDict, total=False):
    evidence: str
    question: str
    commit: str      # the analyst's cache, by id: all that crosses the edge
    handoff: str     # how the writer got it: "<commit>:full" (its cache) or "<commit>:text"
    answer: str


def chat(**c2c) -> ChatOpenAI:
    return ChatOpenAI(base_url=BASE_URL, api_key=API_KEY, model=MODEL, temperature=0, max_tokens=48,
                      include_response_headers=True, extra_body={"c2c": c2c})


def analyst(state: State) -> State:
    reply = chat(session=f"lg-analyst-{RUN}", publish={"stream": "example-langgraph-notes"}).invoke(
        [("system", SYSTEM), ("user", state["evidence"])])
    return {"commit": reply.response_metadata["headers"]["x-c2c-commit"]}


def writer(state: State) -> State:
    reply = chat(session=f"lg-writer-{RUN}", attach=[state["commit"]], mode="auto").invoke(
        [("system", SYSTEM), ("user", state["question"])])
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
    out = build().invoke({"evidence": "At 09:14 deploy 7 broke the API; it was rolled back at 09:31.",
                          "question": "When did the outage end?"})
    print("commit:", out["commit"])
    print("handoff:", out["handoff"])
    print("writer:", out["answer"])
