"""Two `c2c serve` processes share one Redis store: an agent on one publishes, an agent on the other attaches."""

from __future__ import annotations

import os
import shutil

import pytest

from c2c.testing import RedisServer
from serve_helpers import SYSTEM, ServeProcess, c2c_field, chat, make_home, write_tokens

pytestmark = pytest.mark.redis

EVIDENCE = {"role": "user", "name": "evidence", "content": "Evidence: the cache tier lost its primary at 02:10."}
QUESTION = {"role": "user", "content": "What failed, and when?"}


@pytest.fixture
def redis_url(tmp_path):
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not on PATH; CI must run the Redis tests")
        pytest.skip("redis-server is not on PATH")
    server = RedisServer(tmp_path / "redis").start()
    yield server.url(domain="research")
    server.stop()


def test_publish_on_one_server_attach_on_another(tmp_path, redis_url):
    home = make_home(tmp_path)  # one keyring: both servers trust the research domain's key
    tokens = write_tokens(tmp_path / "tokens.json")
    args = ("--model", "tiny-qwen2", "--tokens", str(tokens), "--store", redis_url)
    one = ServeProcess(home, *args).start()
    try:
        two = ServeProcess(home, *args).start()
        try:
            r1 = chat(one.client("analyst"), [SYSTEM, EVIDENCE], max_tokens=6,
                      c2c={"session": "analyst-a", "publish": {"stream": "analyst"}})
            pub = c2c_field(r1)["publish"]
            r2 = chat(two.client("writer"), [SYSTEM, QUESTION],
                      c2c={"session": "writer-b", "attach": [pub["commit"]], "mode": "auto"})
            [rec] = c2c_field(r2)["attach"]
            assert rec["path"] == "cache", rec
            assert r2.usage.prompt_tokens_details.cached_tokens == pub["tokens"]
            # the same answer as the writer reading the analyst's whole conversation itself, on server two
            inline = [SYSTEM, EVIDENCE, {"role": "assistant", "content": r1.choices[0].message.content}, QUESTION]
            assert r2.choices[0].message.content == chat(two.client("writer"), inline).choices[0].message.content
        finally:
            two.stop()
    finally:
        one.stop()
