"""Enumerate, filter and rank meshes on a cluster."""

from meshplan.planner.plan import Candidate, Plan, enumerate_layouts, plan

__all__ = ["Candidate", "Plan", "enumerate_layouts", "plan"]
