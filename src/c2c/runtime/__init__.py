"""Runtime: prefill, capture, attach and continue from KV-caches; re-position slices."""

from c2c.runtime.kvcache import KVCache

__all__ = ["KVCache"]
