"""Analyst -> writer with the OpenAI Agents SDK over `c2c serve`: the writer continues from the analyst's cache.

    bash scripts/setup.sh              # .venv, with the examples' extras (once)
    .venv/bin/c2c serve &
    .venv/bin/python examples/agents_sdk_handoff.py

Both agents are stock ``agents.Agent`` objects on an ``OpenAIChatCompletionsModel``
pointed at the server. The analyst's ``ModelSettings.extra_body`` publishes its
session's KV cache; the writer's attaches the commit (mode ``auto``: the cache if
every check passes, else the analyst's text, with the reason). The SDK keeps no
unknown response fields, so an httpx response hook reads the server's ``x-c2c-*``
headers. Tracing is off: nothing leaves this machine.

Environment: C2C_BASE_URL (default http://127.0.0.1:8000/v1), C2C_API_KEY, C2C_MODEL.
"""

import asyncio
import os
import uuid

import httpx
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

RUN = uuid.uuid4().hex[:8]  # this run's own sessions: a rerun starts fresh

BASE_URL = os.environ.get("C2C_BASE_URL", "http://127.0.0.1:8000/v1")
API_KEY = os.environ.get("C2C_API_KEY", "none")
MODEL = os.environ.get("C2C_MODEL", "Qwen2.5-Coder-0.5B-Instruct")
SYSTEM = "You are one agent of a two-agent incident team. Be brief."

seen: dict[str, str] = {}  # the x-c2c-* headers of the last response


async def keep_c2c_headers(response: httpx.Response) -> None:
    seen.update({k: v for k, v in response.headers.items() if k.startswith("x-c2c-")})


def agent(name: str, **c2c) -> Agent:
    client = AsyncOpenAI(base_url=BASE_URL, api_key=API_KEY,
                         http_client=httpx.AsyncClient(event_hooks={"response": [keep_c2c_headers]}))
    settings = ModelSettings(temperature=0, max_tokens=48, extra_body={"c2c": c2c})
    return Agent(name=name, instructions=SYSTEM, model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
                 model_settings=settings)


async def main() -> None:
    set_tracing_disabled(True)
    await Runner.run(agent("analyst", session=f"sdk-analyst-{RUN}", publish={"stream": "example-agents-sdk-notes"}),
                     "At 09:14 deploy 7 broke the API; it was rolled back at 09:31.")
    commit = seen["x-c2c-commit"]
    answer = await Runner.run(agent("writer", session=f"sdk-writer-{RUN}", attach=[commit], mode="auto"),
                              "When did the outage end?")
    print("commit:", commit)
    print("handoff:", seen["x-c2c-handoffs"])
    print("writer:", answer.final_output)


if __name__ == "__main__":
    asyncio.run(main())
