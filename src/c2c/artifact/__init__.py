"""Artifact: the exchange format. safetensors bytes plus a canonical, signable header."""

from c2c.artifact.codec import Artifact, write_atomic
from c2c.artifact.header import FORMAT_VERSION, ArtifactHeader

__all__ = ["Artifact", "ArtifactHeader", "FORMAT_VERSION", "write_atomic"]
