"""Declarative, incremental build rules that turn ONNX models into EP-specific compiled artifacts.

Only `rules.tasks` knows doit; every other module is plain Python that tests call directly.
"""

RULES_FORMAT = 1
"""Bumped whenever a change to these rules changes what an artifact contains; part of every task's config."""
