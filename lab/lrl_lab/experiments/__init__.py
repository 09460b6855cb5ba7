"""Experiments that produce lrl's result tables; each writes markdown and a plot."""
