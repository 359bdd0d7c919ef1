"""Judging an artifact against its CPU reference: references, sessions, comparisons, task metrics, pipelines, fleets."""
