"""Analytic cost model: pure functions from frozen specs to frozen results (DESIGN.md)."""
