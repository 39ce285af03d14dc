"""The same agent as examples/agent_context.py as a LangGraph loop: a tool node and a model node.

    bash scripts/setup.sh              # .venv, with the examples' extras (once)
    .venv/bin/c2c serve &
    .venv/bin/python examples/agent_context_langgraph.py

The graph's state keeps every message (LangGraph's ``add_messages``); the model node asks the
policy helper which tool results to drop and passes that as the request's ``extra_body``, so
the server drops them from the session's cache instead of the graph deleting them. LangChain
keeps no unknown response fields, so the node reads the server's ``x-c2c-*`` headers.

Environment: C2C_BASE_URL (default http://127.0.0.1:8000/v1), C2C_API_KEY, C2C_MODEL.
"""

import os
import uuid
from typing import Annotated, TypedDict

from langchain_core.messages import AIMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from c2c.client.context_policy import ContextPolicy, ContextWindow

BASE_URL = os.environ.get("C2C_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("C2C_MODEL", "Qwen2.5-Coder-0.5B-Instruct")
LOGS = ["api-1: 502 errors since 09:14 after deploy 7.", "db-2: replication lag 40 s, recovering.",
        "cache-3: hit rate normal at 97%.", "api-1: rolled back to deploy 6 at 09:31.",
        "queue-4: backlog drained by 09:40.", "api-1: error rate back to 0.1% at 09:45."]

llm = ChatOpenAI(base_url=BASE_URL, api_key=os.environ.get("C2C_API_KEY", "none"), model=MODEL, temperature=0,
                 max_tokens=16, include_response_headers=True)
window = ContextWindow(ContextPolicy(keep_tool_responses=3), session=f"oncall-lg-{uuid.uuid4().hex[:8]}")


class State(TypedDict):
    messages: Annotated[list, add_messages]
    step: int


def tool(state: State) -> dict:
    k = state["step"]
    call = {"name": "read_log", "args": {"n": k + 1}, "id": f"call_{k}"}   # the call, and its result by its id
    return {"messages": [AIMessage(content=f"Reading log {k + 1}.", tool_calls=[call]),
                         ToolMessage(content=LOGS[k], tool_call_id=call["id"])], "step": k + 1}


def model(state: State) -> dict:
    messages = state["messages"]
    reply = llm.invoke(messages, extra_body=window.extra_body(messages))
    headers = reply.response_metadata["headers"]
    print(f"step {state['step']}: dropped {window.drops(messages)}, edit {headers.get('x-c2c-edit', '-')}, "
          f"cached {headers['x-c2c-cached-tokens']}")
    return {}


graph = StateGraph(State)
graph.add_node("tool", tool)
graph.add_node("model", model)
graph.add_edge(START, "tool")
graph.add_edge("tool", "model")
graph.add_conditional_edges("model", lambda s: "tool" if s["step"] < len(LOGS) else END)
final = graph.compile().invoke({"messages": [SystemMessage(content="You are an on-call agent. Be brief.")], "step": 0})
print("messages kept in the graph:", len(final["messages"]))
print("dropped:", window.drops(final["messages"]))
