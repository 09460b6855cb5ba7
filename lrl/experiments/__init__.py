"""Experiments that produce the spec's tables on TinyAgent; each writes markdown and a plot."""
