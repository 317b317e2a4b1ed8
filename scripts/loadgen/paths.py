"""Where the load generator finds things in the repository: its root, the audio fixtures the
callers say, the default config the server runs and where results go. Shared by the modules
that read fixtures, start the server and write results, and by the command line's defaults."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

AUDIO = ROOT / "tests" / "fixtures" / "audio"
RESULTS = ROOT / "loadtest-results"
DEFAULT_CONFIG = ROOT / "config" / "agents.yaml"
