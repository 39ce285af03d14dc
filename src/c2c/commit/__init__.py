"""Commits: the one author of every commit header (:mod:`c2c.commit.author`), whichever front-end publishes."""
