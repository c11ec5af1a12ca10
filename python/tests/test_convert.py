"""`nnx.convert`: a transformers folder to a GGUF file the `gguf` package reads, and SafeTensors
to SafeTensors in another dtype."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import safetensors.numpy
from gguf import GGUFReader

import nnx
from support import FIXTURES

LLAMA3 = FIXTURES / "models" / "llama3"
GPT2 = FIXTURES / "gpt2-tiny" / "model.safetensors"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("convert") / "llama3-q8_0.gguf"
    summary = nnx.convert(LLAMA3, out, type="q8_0")
    return out, summary


def test_convert_to_q8_0_writes_a_gguf_file(converted: tuple[Path, str]) -> None:
    out, summary = converted
    assert isinstance(summary, str) and summary.strip(), summary
    assert out.is_file()
    assert [p.name for p in out.parent.iterdir()] == [out.name], "only the output is left"


def test_the_gguf_file_has_llama_cpps_tensors_and_types(converted: tuple[Path, str]) -> None:
    out, _ = converted
    ours = GGUFReader(out)
    theirs = GGUFReader(LLAMA3 / "model-q8_0.gguf")
    ours_types = {t.name: t.tensor_type.name for t in ours.tensors}
    theirs_types = {t.name: t.tensor_type.name for t in theirs.tensors}
    # nnx's converter does not write Llama 3's rope scaling as llama.cpp's `rope_freqs.weight`
    # (the conversion says so in its notes); every other tensor is llama.cpp's, of llama.cpp's type.
    theirs_types.pop("rope_freqs.weight")
    assert ours_types == theirs_types
    assert "Q8_0" in ours_types.values()
    assert all(ty in ("Q8_0", "F32") for ty in ours_types.values()), ours_types
    for t in ours.tensors:
        if t.name.endswith("_norm.weight"):
            assert t.tensor_type.name == "F32", t.name
        elif t.name != "rope_freqs.weight":
            assert t.tensor_type.name == "Q8_0", t.name
    theirs_shapes = {t.name: list(t.shape) for t in theirs.tensors}
    assert {t.name: list(t.shape) for t in ours.tensors} == {name: theirs_shapes[name] for name in theirs_types}


def test_the_gguf_file_has_the_models_metadata(converted: tuple[Path, str]) -> None:
    out, summary = converted
    ours, theirs = GGUFReader(out), GGUFReader(LLAMA3 / "model-q8_0.gguf")
    assert ours.fields["general.architecture"].contents() == "llama"
    # The hyperparameters llama.cpp needs for a Llama, with llama.cpp's values; any other key nnx
    # writes has llama.cpp's value too.
    needed = [
        "block_count",
        "context_length",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "rope.freq_base",
        "attention.layer_norm_rms_epsilon",
    ]
    for key in needed:
        assert f"llama.{key}" in ours.fields, key
    for key in ours.fields:
        if key.startswith("llama.") and key in theirs.fields:
            assert ours.fields[key].contents() == pytest.approx(theirs.fields[key].contents()), key
    # The tokenizer is llama.cpp's, or the conversion says why it is not written.
    if "tokenizer.ggml.tokens" in ours.fields:
        assert ours.fields["tokenizer.ggml.tokens"].contents() == theirs.fields["tokenizer.ggml.tokens"].contents()
    else:
        assert "tokenizer" in summary and "not written" in summary, summary


def test_the_q8_0_values_are_the_models_within_a_step(converted: tuple[Path, str]) -> None:
    out, _ = converted
    ours = {t.name: t for t in GGUFReader(out).tensors}
    f32 = {t.name: t for t in GGUFReader(LLAMA3 / "model-f32.gguf").tensors}
    for name, t in ours.items():
        want = np.asarray(f32[name].data, dtype=np.float32).reshape(-1)
        got = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1)
        if t.tensor_type.name == "F32":
            # Norms are the model's values; computed tensors (rope_freqs) may move the last bit.
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, err_msg=name)
            continue
        # Q8_0: blocks of 32, codes rounded with the scale d = amax / 127 and d stored in f16:
        # off by at most d / 2 plus 127 times f16's rounding of d (llama.cpp's file is too).
        blocks = want.reshape(-1, 32)
        step = np.abs(blocks).max(axis=1, keepdims=True) / 127
        error = np.abs(got.reshape(-1, 32) - blocks)
        assert np.all(error <= step * (0.5 + 127 * 2.0**-11) + 1e-9), f"{name}: error {error.max()}"
    # And nnx reads its own file as the reference does.
    archive = nnx.open(out)
    for name, t in ours.items():
        assert archive.info(name).dtype == t.tensor_type.name, name
        assert np.array_equal(archive.dequantize(name).reshape(-1), gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1)), name


def test_convert_safetensors_to_f16(tmp_path: Path) -> None:
    out = tmp_path / "model-f16.safetensors"
    summary = nnx.convert(GPT2, out, dtype="f16")
    assert isinstance(summary, str) and summary.strip()
    source = safetensors.numpy.load_file(GPT2)
    back = safetensors.numpy.load_file(out)
    assert sorted(back) == sorted(source)
    for name, array in source.items():
        assert back[name].dtype == np.float16, name
        assert back[name].shape == array.shape, name
        assert back[name].tobytes() == array.astype(np.float16).tobytes(), name
    assert sorted(nnx.open(out).keys()) == sorted(source)
    assert {nnx.open(out).info(name).dtype for name in source} == {"F16"}
