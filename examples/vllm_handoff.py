"""Analyst -> writer as a LangGraph graph over `vllm serve` with c2c's KV connector.

    bash scripts/setup.sh && bash scripts/setup_vllm.sh      # .venv (with the examples' extras) and .venv-vllm
    .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model ~/.cache/c2c/models/SmolLM2-135M-Instruct \\
        --served-model-name smol --enable-prompt-tokens-details \\
        --kv-transfer-config '{"kv_connector":"C2CConnector","kv_connector_module_path":"c2c.vllm.connector",
                               "kv_role":"kv_both","kv_connector_extra_config":{"domain":"research"}}' \\
        --middleware c2c.vllm.api_middleware.C2CMiddleware &
    C2C_BASE_URL=http://127.0.0.1:8000/v1 C2C_MODEL=smol .venv/bin/python examples/vllm_handoff.py

The server command is the same on every CPU this project runs on: vLLM picks bfloat16 or
float32 by the model and its CPU kernel by the machine, and the connector reads each
kernel's blocks (docs/vllm.md lists which).

Each node is a stock ``ChatOpenAI(base_url=...)``. The analyst reads the evidence and
answers; vLLM publishes the K/V of that conversation as a signed commit, and only its id
(with the conversation) goes into the graph state. The writer's request continues the
analyst's conversation and attaches the commit: vLLM loads the analyst's K/V and prefills
only the writer's own turn (or, where a check fails, prefills it all and says why).
The rule that makes it work: the attaching prompt begins with the published conversation.
LangChain keeps no unknown reply fields, so the nodes read c2c's ``x-c2c-*`` headers.

Environment: C2C_BASE_URL (default http://127.0.0.1:8000/v1), C2C_MODEL (default smol).
"""

import os
from typing import TypedDict

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

BASE_URL = os.environ.get("C2C_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("C2C_MODEL", "smol")
SYSTEM = "You are one agent of a two-agent incident team. Be brief."


class State(TypedDict, total=False):
    evidence: str
    conversation: list   # the analyst's messages and answer: the writer's prompt begins with them
    commit: str          # the analyst's cache, by id
    handoff: str         # "<commit, 12 chars>:cache" (its K/V were loaded) or ":text" (prefilled)
    answer: str


def chat(c2c: dict, max_tokens: int) -> ChatOpenAI:
    return ChatOpenAI(base_url=BASE_URL, api_key="unused", model=MODEL, temperature=0, max_tokens=max_tokens,
                      include_response_headers=True, extra_body={"c2c": c2c})


def analyst(state: State) -> State:
    messages = [("system", SYSTEM), ("user", f"Evidence: {state['evidence']}\nWhat happened, in one sentence?")]
    reply = chat({"publish": {"stream": "example-vllm-notes"}}, 32).invoke(messages)
    return {"conversation": messages + [("assistant", reply.content)],
            "commit": reply.response_metadata["headers"]["x-c2c-commit"]}


def writer(state: State) -> State:
    messages = state["conversation"] + [("user", "Write a one-line status update for customers.")]
    reply = chat({"attach": [state["commit"]], "mode": "auto"}, 32).invoke(messages)
    return {"answer": reply.content, "handoff": reply.response_metadata["headers"]["x-c2c-attach"]}


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
