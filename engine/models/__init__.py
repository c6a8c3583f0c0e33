"""The model families the engine runs, one file each (llama.cpp's per-model files), registered
by their GGUF `general.architecture`, and what the engine, the session and the CLI need of a
model (`LanguageModel`). Nothing outside engine/models/ names an architecture: `load_model`
and `load_config` pick the family from the file.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from engine.conventions import ChatConventions
from engine.errors import ModelLoadError
from engine.gguf_file import GGUFFile
from engine.state import State

from . import qwen2, qwen35

__all__ = ["ARCHITECTURES", "Architecture", "LanguageModel", "ModelConfig", "load_config", "load_conventions",
           "load_model"]

Hook = Callable[[str, int, np.ndarray], None]


class ModelConfig(Protocol):
    """The hyperparameters the engine reads (each family's config has more; read-only)."""

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_ctx_train(self) -> int: ...


class LanguageModel(Protocol):
    """A loaded model: weights as views into the mmap'd file, and the forward over a `State`."""

    file: GGUFFile

    @property
    def config(self) -> ModelConfig: ...

    def new_state(self) -> State:
        """An empty state (no tokens): one entry per layer, of the kind the layer keeps."""
        ...

    def forward(self, tokens: np.ndarray, state: State, *, logits: str = "last",
                hook: Hook | None = None) -> np.ndarray | None:
        """T new tokens through every layer as one batch, advancing `state` in place; logits
        "last" (n_vocab,), "all" (T, n_vocab) or "none"."""
        ...

    def forward_capturing(self, tokens: np.ndarray, state: State, capture: Sequence[int], *,
                          logits: str = "last", hook: Hook | None = None
                          ) -> tuple[np.ndarray | None, dict[int, State]]:
        """`forward`, also returning copies of the state after each position in `capture`."""
        ...

    def decode_batch(self, tokens: Sequence[int], states: Sequence[State], *, exact: bool = False) -> np.ndarray:
        """One token for each of B sequences on its own state (advanced in place): (B, n_vocab)
        logits, row b `forward` of tokens[b] on states[b] -- bit for bit when `exact`, else up to
        the rounding of multi-row products (engine/batch.py)."""
        ...


@dataclass(frozen=True)
class Architecture:
    """One registered family: its model class, its config reader (no weights loaded) and its
    chat conventions (reasoning markers, tool-call syntax: engine/conventions.py)."""

    name: str
    model: Callable[[GGUFFile], LanguageModel]
    config: Callable[[GGUFFile], Any]
    conventions: Callable[[GGUFFile], ChatConventions]


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a for a in (
        Architecture(qwen35.ARCH, qwen35.Qwen35, qwen35.Qwen35Config.from_gguf, qwen35.conventions),
        *(Architecture(a, qwen2.Qwen2, qwen2.Qwen2Config.from_gguf, qwen2.conventions) for a in qwen2.ARCHS),
    )
}


def _architecture(f: GGUFFile) -> Architecture:
    arch = ARCHITECTURES.get(f.architecture)
    if arch is None:
        raise ModelLoadError(f"{f.path}: architecture {f.architecture!r} is not supported; supported: "
                             f"{', '.join(sorted(ARCHITECTURES))}")
    return arch


def load_model(f: GGUFFile) -> LanguageModel:
    """The model of the file's family (ModelLoadError naming the supported ones otherwise)."""
    return _architecture(f).model(f)


def load_config(f: GGUFFile) -> Any:
    """The file's hyperparameters as its family reads them, without loading a weight."""
    return _architecture(f).config(f)


def load_conventions(f: GGUFFile) -> ChatConventions:
    """How the file's family marks reasoning and tool calls in a reply."""
    return _architecture(f).conventions(f)
