"""``make model`` / ``make run``: the model file a local run uses.

    python -m function.dev_model MODEL DEFAULT PRESET WEIGHTS

An existing ``MODEL`` is used as it is. Only the default path (``models/<preset>-<weights>.gguf``)
is ever built, with the factory's seeded *random* weights; any other missing path is an error
(a typo in ``MODEL=`` once built a random model there and answered 200).
"""
from __future__ import annotations

import os
import sys

from .progress import heartbeat

# rough build times on one core, for the progress line (tiny: well under a second)
BUILD_HINT = {"tiny": "under a second", "0.8b": "~30 s", "2b": "~90 s"}
FACTORY_NAME_PREFIX = "warmllm-factory-"


def is_factory_model(path: str) -> bool:
    """True for a GGUF our factory wrote (random weights: its text means nothing)."""
    try:
        from engine.gguf_file import GGUFFile
        return str(GGUFFile(path).get("general.name", "")).startswith(FACTORY_NAME_PREFIX)
    except Exception:
        return False


def ensure(model: str, default: str, preset: str, weights: str) -> int:
    if os.path.isfile(model):
        return 0
    if os.path.normpath(model) != os.path.normpath(default):
        print(f"error: MODEL={model} does not exist. Give the path of a GGUF file (README: 'Start here', "
              f"'Which model, which memory'), or leave MODEL unset to build the default random-weights "
              f"test model ({default}).",
              file=sys.stderr)
        return 2
    from engine.synthetic.factory import make_model
    os.makedirs(os.path.dirname(model) or ".", exist_ok=True)
    with heartbeat(f"building {model}, a test model with random weights (preset {preset}, {weights})",
                   BUILD_HINT.get(preset, "")):
        make_model(model, preset=preset, weights=weights, seed=0)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: python -m function.dev_model MODEL DEFAULT PRESET WEIGHTS", file=sys.stderr)
        return 2
    return ensure(*argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
