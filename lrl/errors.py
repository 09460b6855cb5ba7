"""The errors that end a run with one line and an exit status of their own (train.py), in one light module that
imports nothing: what raises them (a worker backend, an engine, a file writer) and what reports them (train.py,
the experiments) both import them from here.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration key or flag with a value that is not allowed, or input that cannot be used; the message
    names the key and what is allowed (exit status 2)."""


class WorkerError(RuntimeError):
    """A rollout worker (a process or a Ray actor) failed, died, went silent, or its cluster could not be
    reached; the message names it and says how (exit status 5)."""


class EngineError(RuntimeError):
    """The inference engine failed during a step; the message says where (exit status 5)."""


class OutputError(RuntimeError):
    """A file of the run could not be written (a full disk, a folder made read-only meanwhile); the message
    names the file and the reason. What was complete before stays intact (exit status 6)."""
