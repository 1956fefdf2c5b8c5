"""tepo-verl's Hydra config group `algorithm/`: the presets (hydra_plugins/tepo_verl_searchpath adds it to verl's
search path)."""

from pathlib import Path

PRESET_DIR = Path(__file__).resolve().parent / "algorithm"


def preset_names() -> list[str]:
    """Every preset, by the name `algorithm=NAME` selects, sorted."""
    return sorted(path.stem for path in PRESET_DIR.glob("*.yaml"))
