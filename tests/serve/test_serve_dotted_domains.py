"""Two tenants whose domain names share a prefix (`acme`, `acme.eu`) each sign with their own key.

The keyring once found `acme`'s key with the glob `acme.*.pem`, which also matched
`acme.eu.<id>.pem`: after `acme.eu` published, `acme` signed with `acme.eu`'s key and
every later `acme` commit failed verification (issue #30, item 3).
"""

from __future__ import annotations

import openai
import pytest

from serve_helpers import SYSTEM, ServeProcess, c2c_field, make_home
from c2c.testing.server_process import write_tokens

TOKENS = {"acme-analyst": ("tok-acme-analyst-0123456789abcdef", "acme"),
          "acme-writer": ("tok-acme-writer-0123456789abcdef", "acme"),
          "eu-analyst": ("tok-eu-analyst-0123456789abcdef", "acme.eu")}


@pytest.fixture(scope="module")
def acme_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-acme")
    server = ServeProcess(make_home(root), "--model", "tiny-qwen2", "--tokens",
                          str(write_tokens(root / "tokens.json", TOKENS))).start()
    yield server
    server.stop()


def ask(server, agent, content, c2c):
    client = openai.OpenAI(base_url=server.base_url, api_key=TOKENS[agent][0], max_retries=0, timeout=60)
    return client.chat.completions.create(model="tiny-qwen2", max_tokens=3, temperature=0, extra_body={"c2c": c2c},
                                          messages=[SYSTEM, {"role": "user", "content": content}])


def test_acme_and_acme_eu_publish_and_attach_with_their_own_keys(acme_server):
    def publish(agent, content, stream):
        return c2c_field(ask(acme_server, agent, content, {"publish": {"stream": stream}}))["publish"]

    first = publish("acme-analyst", "acme's first note", "notes")
    eu = publish("eu-analyst", "acme.eu's note", "eu-notes")
    again = publish("acme-analyst", "acme's second note", "notes-2")  # after acme.eu has a newer key
    assert eu["signed_by"]["domain"] == "acme.eu" and again["signed_by"]["domain"] == "acme"
    assert again["signed_by"]["key_id"] == first["signed_by"]["key_id"] != eu["signed_by"]["key_id"]
    for agent, pub in (("acme-writer", again), ("eu-analyst", eu)):  # each commit verifies in its own domain
        [rec] = c2c_field(ask(acme_server, agent, "go on", {"attach": [pub["commit"]], "mode": "full"}))["attach"]
        assert rec["path"] == "cache", rec
