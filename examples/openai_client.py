"""Hand one agent's KV cache to another with the stock openai client, against `c2c serve` or `vllm serve`.

    bash scripts/setup.sh                          # .venv, with the examples' extras (once)
    .venv/bin/c2c serve &                          # Qwen2.5-Coder-0.5B-Instruct on http://127.0.0.1:8000/v1
    .venv/bin/python examples/openai_client.py

The same script runs unchanged against vLLM with c2c's connector (docs/vllm.md gives the
server command): only C2C_BASE_URL changes. The writer's request continues the analyst's
conversation (its messages, then the analyst's reply, then the writer's question) and
attaches the analyst's commit: the server loads the analyst's K/V for that conversation
instead of prefilling it (or, where a check fails, prefills it and says why).

Environment: C2C_BASE_URL (default http://127.0.0.1:8000/v1), C2C_API_KEY (a token
from the server's --tokens file; anything without one), C2C_MODEL (default: the model
the server serves).
"""

import os

from openai import OpenAI

BASE_URL = os.environ.get("C2C_BASE_URL", "http://127.0.0.1:8000/v1")
SYSTEM = {"role": "system", "content": "You are one agent of a two-agent incident team. Be brief."}

# The three lines: any OpenAI client works against the server (a system prompt and max_tokens, as always).
client = OpenAI(base_url=BASE_URL, api_key=os.environ.get("C2C_API_KEY", "none"))
MODEL = os.environ.get("C2C_MODEL") or client.models.list().data[0].id
reply = client.chat.completions.create(
    model=MODEL, messages=[SYSTEM, {"role": "user", "content": "Say hello."}], max_tokens=24)
print("reply:", reply.choices[0].message.content)

# The analyst reads the evidence and answers; the server publishes the K/V of that conversation ...
conversation = [SYSTEM, {"role": "user", "content": "At 09:14 deploy 7 broke the API; rolled back at 09:31."}]
analyst = client.chat.completions.create(
    model=MODEL, messages=conversation, max_tokens=24, temperature=0,
    extra_body={"c2c": {"publish": {"stream": "example-incident-notes"}}})
published = analyst.model_extra["c2c"]["publish"]  # the openai client keeps unknown fields in model_extra
commit = published["commit"]
print(f"analyst published commit {commit[:12]} (stream {published['stream']} v{published['version']})")
conversation.append({"role": "assistant", "content": analyst.choices[0].message.content})

# ... and the writer continues that conversation from the analyst's cache instead of re-reading it.
writer = client.chat.completions.create(
    model=MODEL, messages=conversation + [{"role": "user", "content": "When did the outage end?"}], max_tokens=24,
    temperature=0, extra_body={"c2c": {"attach": [commit], "mode": "auto"}})
[handoff] = writer.model_extra["c2c"]["attach"]
print(f"handoff took the {handoff['path']} path ({handoff['used']}): {handoff['reason']}")
print(f"commit tokens {handoff['tokens']}: imported {handoff['imported_tokens']}, reused "
      f"{handoff['reused_tokens']}, prefilled {handoff['prefilled_tokens']}")
print(f"cached tokens {writer.usage.prompt_tokens_details.cached_tokens} of {writer.usage.prompt_tokens}")
print("writer:", writer.choices[0].message.content)
