"""c2c: cache-to-cache communication for multi-agent LLM systems.

The public surface is re-exported here, lazily (``import c2c`` does not load
torch or transformers until a name is used), and pinned by
``tests/test_public_api.py``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Agent": "c2c.team.agent", "Team": "c2c.team.agent",
    "Artifact": "c2c.artifact", "ArtifactHeader": "c2c.artifact",
    "C2CError": "c2c.errors",
    "Fingerprint": "c2c.artifact.fingerprint",
    "Handoff": "c2c.handoff", "hand_off": "c2c.handoff", "HandoffPolicy": "c2c.handoff",
    "Decision": "c2c.handoff", "decide": "c2c.handoff",
    "KVCache": "c2c.runtime.kvcache",
    "PrefixRef": "c2c.artifact.prefix", "SharedPrefix": "c2c.artifact.prefix",
    "Runtime": "c2c.runtime.protocol",
    "load_model": "c2c.runtime.zoo",
    "open_store": "c2c.store.url",
    "Settings": "c2c.config", "settings": "c2c.config",
}
_RENAMES = {"load_model": "load"}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), _RENAMES.get(name, name))
        globals()[name] = value
        return value
    raise AttributeError(f"module 'c2c' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover
    from c2c.artifact import Artifact, ArtifactHeader
    from c2c.artifact.fingerprint import Fingerprint
    from c2c.artifact.prefix import PrefixRef, SharedPrefix
    from c2c.config import Settings, settings
    from c2c.errors import C2CError
    from c2c.handoff import Decision, Handoff, HandoffPolicy, decide, hand_off
    from c2c.runtime.protocol import Runtime
    from c2c.runtime.kvcache import KVCache
    from c2c.runtime.zoo import load as load_model
    from c2c.store.url import open_store
    from c2c.team.agent import Agent, Team
