"""Talk to `c2c serve` with the stock openai client, then hand one agent's cache to another.

    bash scripts/setup.sh              # .venv, with the examples' extras (once)
    .venv/bin/c2c serve &              # Qwen2.5-Coder-0.5B-Instruct on http://127.0.0.1:8000/v1
    .venv/bin/python examples/openai_client.py

Environment: C2C_BASE_URL (default http://127.0.0.1:8000/v1), C2C_API_KEY (a token
from the server's --tokens file; anything without one), C2C_MODEL.
"""

import os
import uuid

from openai import OpenAI

BASE_URL = os.environ.get("C2C_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("C2C_MODEL", "Qwen2.5-Coder-0.5B-Instruct")
SYSTEM = {"role": "system", "content": "You are one agent of a two-agent incident team. Be brief."}
RUN = uuid.uuid4().hex[:8]  # this run's own sessions: a rerun starts fresh instead of continuing the last one

# The three lines: any OpenAI client works against c2c serve (a system prompt and max_tokens, as always).
client = OpenAI(base_url=BASE_URL, api_key=os.environ.get("C2C_API_KEY", "none"))
reply = client.chat.completions.create(
    model=MODEL, messages=[SYSTEM, {"role": "user", "content": "Say hello."}], max_tokens=24)
print("reply:", reply.choices[0].message.content)

# The analyst reads the evidence in its session and publishes its KV cache to its domain's stream ...
evidence = {"role": "user", "name": "evidence", "content": "At 09:14 deploy 7 broke the API; rolled back at 09:31."}
analyst = client.chat.completions.create(
    model=MODEL, messages=[SYSTEM, evidence], max_tokens=24, temperature=0,
    extra_body={"c2c": {"session": f"analyst-{RUN}", "publish": {"stream": "example-incident-notes"}}})
published = analyst.model_extra["c2c"]["publish"]  # the openai client keeps unknown fields in model_extra
commit = published["commit"]
print(f"analyst published commit {commit[:12]} (stream {published['stream']} v{published['version']})")

# ... and the writer continues from that cache instead of re-reading the text (or gets the text, and why).
writer = client.chat.completions.create(
    model=MODEL, messages=[SYSTEM, {"role": "user", "content": "When did the outage end?"}], max_tokens=24,
    temperature=0, extra_body={"c2c": {"session": f"writer-{RUN}", "attach": [commit], "mode": "auto"}})
[handoff] = writer.model_extra["c2c"]["attach"]
print(f"handoff took the {handoff['path']} path ({handoff['used']}): {handoff['reason']}")
print(f"commit tokens {handoff['tokens']}: imported {handoff['imported_tokens']}, reused "
      f"{handoff['reused_tokens']}, prefilled {handoff['prefilled_tokens']}")
print(f"cached tokens {writer.usage.prompt_tokens_details.cached_tokens} of {writer.usage.prompt_tokens}")
print("writer:", writer.choices[0].message.content)
