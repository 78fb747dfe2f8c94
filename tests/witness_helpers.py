"""Helpers for witness tests: `apollia-os witness serve` as a process, the CLI, a home's witness entries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from apollia_nb.home import Home

APOLLIA = [sys.executable, "-m", "apollia_nb"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APOLLIA, *args], check=False, capture_output=True, text=True, timeout=120)


class WitnessProcess:
    """`apollia-os witness serve` as a subprocess, its URL and key read from its first line."""

    def __init__(self, directory: Path, *trust: str, port: int = 0) -> None:
        self.directory = directory
        args = [*APOLLIA, "witness", "serve", "--home-dir", str(directory), "--port", str(port), "--json"]
        for key in trust:
            args += ["--trust", key]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read()
        info = json.loads(line)
        self.url, self.key, self.port = info["url"], info["key"], int(info["url"].rsplit(":", 1)[1])

    def stop(self, *, kill: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
            self.proc.wait(10)
        self.proc.stdout.close()
        self.proc.stderr.close()


def configure(home: Home, *ws: WitnessProcess) -> None:
    home.config_path.write_text("".join(f'[[journal.witnesses]]\nurl = "{w.url}"\nkey = "{w.key}"\n' for w in ws))
