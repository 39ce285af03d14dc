"""Analyst -> writer with the OpenAI Agents SDK over `c2c serve` or `vllm serve`: the writer goes on from the
analyst's cache.

    bash scripts/setup.sh              # .venv, with the examples' extras (once)
    .venv/bin/c2c serve &
    .venv/bin/python examples/agents_sdk_handoff.py

The same script runs unchanged against vLLM with c2c's connector (docs/vllm.md gives the
server command): only C2C_BASE_URL changes.

Both agents are stock ``agents.Agent`` objects with the same instructions, on an
``OpenAIChatCompletionsModel`` pointed at the server. The analyst's ``ModelSettings.extra_body``
publishes the K/V of its run; the writer's input continues that run (``to_input_list()`` and
its own question) and its ``extra_body`` attaches the commit (mode ``auto``: the cache if every
check passes, else a prefill, with the reason). The SDK keeps no unknown response fields, so an
httpx response hook reads the server's ``x-c2c-*`` headers. Tracing is off: nothing leaves
this machine.

Environment: C2C_BASE_URL (default http://127.0.0.1:8000/v1), C2C_API_KEY, C2C_MODEL
(default: the model the server serves).
"""

import asyncio
import os

import httpx
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI, OpenAI

BASE_URL = os.environ.get("C2C_BASE_URL", "http://127.0.0.1:8000/v1")
API_KEY = os.environ.get("C2C_API_KEY", "none")
MODEL = os.environ.get("C2C_MODEL") or OpenAI(base_url=BASE_URL, api_key=API_KEY).models.list().data[0].id
SYSTEM = "You are one agent of a two-agent incident team. Be brief."

seen: dict[str, str] = {}  # the x-c2c-* headers of the last response


async def keep_c2c_headers(response: httpx.Response) -> None:
    seen.update({k: v for k, v in response.headers.items() if k.startswith("x-c2c-")})


def agent(name: str, **c2c) -> Agent:
    client = AsyncOpenAI(base_url=BASE_URL, api_key=API_KEY,
                         http_client=httpx.AsyncClient(event_hooks={"response": [keep_c2c_headers]}))
    settings = ModelSettings(temperature=0, max_tokens=32, extra_body={"c2c": c2c})
    return Agent(name=name, instructions=SYSTEM, model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
                 model_settings=settings)


async def main() -> None:
    set_tracing_disabled(True)
    analysis = await Runner.run(agent("analyst", publish={"stream": "example-agents-sdk-notes"}),
                                "At 09:14 deploy 7 broke the API; it was rolled back at 09:31.")
    commit = seen["x-c2c-commit"]
    answer = await Runner.run(agent("writer", attach=[commit], mode="auto"),
                              analysis.to_input_list() + [{"role": "user", "content": "When did the outage end?"}])
    print("commit:", commit)
    print("handoff:", seen["x-c2c-handoffs"])
    print("writer:", answer.final_output)


if __name__ == "__main__":
    asyncio.run(main())
