"""The CLI reference in docs/ is generated from the commands and must not drift."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_is_current():
    out = subprocess.run([sys.executable, str(ROOT / "dev" / "docs" / "make_cli_reference.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_every_spec_command_is_in_the_cli():
    text = (ROOT / "docs" / "cli.md").read_text()
    for command in ["demo", "run", "agents list", "agents register", "agents stop", "pending list",
                    "pending decide", "rules list", "rules add", "rules remove", "devmode", "policy keygen",
                    "policy sign", "policy check", "audit verify", "audit checkpoint", "audit prove",
                    "audit export"]:
        assert f"## `apollia-os {command}`" in text, command
