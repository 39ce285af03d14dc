"""c2c: cache-to-cache communication for multi-agent LLM systems.

The public surface is re-exported here and pinned by ``tests/test_public_api.py``.
"""

from c2c.agent import Agent, Team
from c2c.artifact import Artifact, ArtifactHeader
from c2c.errors import C2CError
from c2c.fingerprint import Fingerprint
from c2c.handoff import Handoff, hand_off
from c2c.prefix import PrefixRef, SharedPrefix
from c2c.runtime.engine import Runtime
from c2c.runtime.kvcache import KVCache
from c2c.runtime.zoo import load as load_model

__version__ = "0.1.0"

__all__ = [
    "Agent", "Artifact", "ArtifactHeader", "C2CError", "Fingerprint", "Handoff", "KVCache", "PrefixRef",
    "Runtime", "SharedPrefix", "Team", "hand_off", "load_model", "__version__",
]
