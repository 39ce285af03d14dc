"""Flows of many handoffs: pipelines (A -> B -> C), a router across models, chains over the store."""
