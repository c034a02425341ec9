"""Analytic cost model: pure functions from frozen specs to frozen results (docs/design.md)."""
