"""A tool-calling agent on `c2c serve` whose old tool results leave the server's cache, not its history.

    bash scripts/setup.sh              # .venv, with the examples' extras (once)
    .venv/bin/c2c serve &              # Qwen2.5-Coder-0.5B-Instruct on http://127.0.0.1:8000/v1
    .venv/bin/python examples/agent_context.py

Each step the model calls the ``read_log`` tool (the request names it in ``tool_choice``, so the
reply is always a call; the model picks the service), the agent runs it and appends the call and
its result, as any OpenAI tool loop does. The agent keeps its full message list. Before each
request the policy helper (``c2c.client.context_policy``) says which tool results the model no
longer reads: here the last 3 are kept. The server drops the older ones from the session's cache
and re-positions what followed, so each step prefills only the new messages instead of everything
after the first deleted one. Each line shows the call and what the server did; the last asks about
a fact of a recent tool result.

Environment: C2C_BASE_URL (default http://127.0.0.1:8000/v1), C2C_API_KEY, C2C_MODEL.
"""

import json
import os
import uuid

from openai import OpenAI

from c2c.client.context_policy import ContextPolicy, ContextWindow

BASE_URL = os.environ.get("C2C_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("C2C_MODEL", "Qwen2.5-Coder-0.5B-Instruct")
TOOLS = [{"type": "function", "function": {
    "name": "read_log", "description": "Read the newest line of one service's log.",
    "parameters": {"type": "object", "properties": {"service": {"type": "string", "description": "e.g. api-1"}},
                   "required": ["service"]}}}]
LOGS = ["api-1: 502 errors since 09:14 after deploy 7.", "db-2: replication lag 40 s, recovering.",
        "cache-3: hit rate normal at 97%.", "api-1: rolled back to deploy 6 at 09:31.",
        "queue-4: backlog drained by 09:40.", "api-1: error rate back to 0.1% at 09:45."]

client = OpenAI(base_url=BASE_URL, api_key=os.environ.get("C2C_API_KEY", "none"))
window = ContextWindow(ContextPolicy(keep_tool_responses=3), session=f"oncall-{uuid.uuid4().hex[:8]}")
messages = [{"role": "system", "content": "You are an on-call agent reading logs. Be brief."},
            {"role": "user", "content": "Read the logs of api-1, db-2, cache-3 and queue-4, one call at a time."}]
for step, log in enumerate(LOGS, 1):
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=32, temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "read_log"}},
                                       extra_body=window.extra_body(messages))
    call = r.choices[0].message.tool_calls[0]
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": log}]   # the tool's result
    edit = (r.model_extra.get("c2c") or {}).get("edit") or {}
    usage = r.usage.model_extra  # the openai client keeps unknown usage fields here
    print(f"step {step}: read_log({json.loads(call.function.arguments)}), prompt {r.usage.prompt_tokens}, "
          f"cached {r.usage.prompt_tokens_details.cached_tokens}, prefilled {usage.get('prefilled_tokens', '-')}, "
          f"dropped {usage.get('dropped_tokens', 0)} tokens (messages {edit.get('dropped_messages', [])}), "
          f"exact {edit.get('exact', True)}")
question = messages + [{"role": "user", "content": "When was api-1 rolled back?"}]
r = client.chat.completions.create(model=MODEL, messages=question, tools=TOOLS, tool_choice="none", max_tokens=24,
                                   temperature=0, extra_body=window.extra_body(question))
print("answer:", r.choices[0].message.content)
print("dropped:", window.drops(question))
