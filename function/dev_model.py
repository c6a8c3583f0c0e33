"""``make model`` / ``make run``: the model file a local run uses.

    python -m function.dev_model [--real-first] [--print] MODEL DEFAULT PRESET WEIGHTS

An existing ``MODEL`` is used as it is. Only the default path (``models/<preset>-<weights>.gguf``)
is ever built, with the factory's seeded *random* weights; any other missing path is an error
(a typo in ``MODEL=`` once built a random model there and answered 200).

``--real-first`` (``make run`` when no MODEL, PRESET or WEIGHTS is given): the real trained model
(``make real-model``: fetched once, verified, cached outside the work tree) is the one to answer
with; when it cannot be had (offline, a piece that does not verify) the reason is said and the
random test model answers instead, saying so. ``--print``: the chosen path on stdout.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from . import real_model
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


def real_first(default: str, preset: str, weights: str, *, fetch: Callable[[], Path] = real_model.fetch,
               out: str = real_model.DEFAULT_OUT) -> tuple[int, str]:
    """(status, path): the real model linked at `out`, or, when it cannot be had, the default
    random-weights model (built if absent), with the reason on stderr."""
    try:
        real_model.link(fetch(), Path(out))
        return 0, out
    except (real_model.RealModelError, OSError) as exc:
        print(f"warmllm: the real model is not available here ({exc}); answering with the random-weights "
              f"test model {default} instead: its text means nothing (`make real-model` says more)",
              file=sys.stderr, flush=True)
    return ensure(default, default, preset, weights), default


def main(argv: list[str]) -> int:
    flags = {a for a in argv if a.startswith("--")}
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 4 or flags - {"--real-first", "--print"}:
        print("usage: python -m function.dev_model [--real-first] [--print] MODEL DEFAULT PRESET WEIGHTS",
              file=sys.stderr)
        return 2
    model, default, preset, weights = args
    if "--real-first" in flags:
        status, model = real_first(default, preset, weights)
    else:
        status = ensure(model, default, preset, weights)
    if status == 0 and "--print" in flags:
        print(model)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
