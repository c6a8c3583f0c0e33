"""The cases both the llama.cpp recorder and our parity tests run: one list, so they cannot drift."""
from __future__ import annotations

import numpy as np

# Factory models the fixtures cover: (preset, weights, seed).
PARITY_MODELS: list[tuple[str, str, int]] = [("tiny", "F32", 0), ("tiny", "Q8_0", 0), ("tiny", "Q4_K_M", 0)]

TOKENIZE_STRINGS: list[str] = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "   leading spaces and trailing   ",
    "multiple\n\nnewlines\n\n\nhere",
    "tabs\tand\tmore\ttabs",
    "Ünïcödé àccénts: café, naïve, façade, Ærøskøbing",
    "Straße München Zürich",
    "日本語のテキストです。",
    "中文分词测试，包括标点符号。",
    "한국어 문장입니다.",
    "Emoji: 😀🚀🎉 and 👩‍💻 with skin tone 👍🏽",
    "Numbers 1234567890 and 3.14159 and 1,000,000",
    "I'm sure you're right; they've said it's fine, we'll see, he'd know",
    "DON'T SHOUT, IT'S RUDE",
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { sum += x[i]; }",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "text with <|endoftext|> inside",
    "a" * 50,
    "!!!???...,,,;;;",
    "snake_case_name and camelCaseName and kebab-case-name",
    "https://example.com/path?query=1&other=two#frag",
    "line one\r\nline two\r\n",
    "   ",
    "\n",
    "Mixed 日本 English ñ 123 😀 end",
    "SELECT * FROM users WHERE id = 42;",
    "The year 2026 had 365 days.",
    "x",
]


def logit_prompts(n: int = 20, vocab: int = 1800, seed: int = 7) -> list[list[int]]:
    """Seeded token-id prompts from 1 to 300 tokens."""
    rng = np.random.default_rng(seed)
    lengths = [1, 2, 3, 5, 8, 13, 21, 34, 50, 63, 64, 65, 90, 128, 150, 200, 255, 256, 280, 300][:n]
    return [rng.integers(0, vocab, L).tolist() for L in lengths]


def greedy_prompts(n: int = 20, vocab: int = 1800, seed: int = 11) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(1, 40))).tolist() for _ in range(n)]


GREEDY_TOKENS = 32
