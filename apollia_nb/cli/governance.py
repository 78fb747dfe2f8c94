"""`apollia-os` commands: governance."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add this group's commands to the parser."""
