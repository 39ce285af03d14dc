"""Agents of a team: :class:`Agent`, :class:`Team`, and caches across LoRA roles."""

from c2c.team.agent import Agent, Stats, Team

__all__ = ["Agent", "Stats", "Team"]
