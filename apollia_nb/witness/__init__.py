"""Witnesses for journals: the witness server (``server``) and the home's sender (``sender``).

The formats and the decisions are pure, in :mod:`apollia_nb.journal.witness`.
"""
