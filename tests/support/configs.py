"""The default agents file, copied with some sections replaced, for servers built by tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent


def default_config_with(folder: Path, **sections: Any) -> Path:
    """config/agents.yaml written to `folder` with top-level `sections` replaced; the agents'
    functions and intents files still resolve to config/."""
    data = yaml.safe_load((ROOT / "config" / "agents.yaml").read_text())
    for agent in data["agents"].values():
        for key in ("functions", "intents"):
            if key in agent:
                agent[key] = str(ROOT / "config" / agent[key])
    data.update(sections)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "agents.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
