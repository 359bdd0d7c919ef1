"""epbuild's own versions: the package's, and the format of what its rules write."""

RULES_FORMAT = 1
"""Bumped whenever a change to these rules changes what an artifact contains; part of every task's config."""
