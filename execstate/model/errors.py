"""Errors of naming a model (no torch here: the CLI catches them without loading a model stack)."""

from __future__ import annotations


class UnknownModelError(ValueError):
    """A model name that is neither a model directory nor an embedded model of the right kind (the
    CLI prints it as one line, not a traceback)."""
