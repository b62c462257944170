"""Finding models: the embedded GGUF cache, local directories, and a clear error for unknown ids offline."""

import time

import pytest
import torch

from rosellm_edu import LLM, model_loader


def test_embedded_model_is_converted_once_then_found_in_the_cache(embedded_dir):
    assert (embedded_dir / "config.json").exists() and list(embedded_dir.glob("*.safetensors"))
    start = time.perf_counter()
    assert model_loader.resolve_model() == embedded_dir
    assert time.perf_counter() - start < 5  # a cache hit, not a 25 s conversion


def test_embedded_model_is_the_135m_llama(embedded_dir):
    config = model_loader.load_config(embedded_dir)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.num_key_value_heads, config.vocab_size) == ("llama", 30, 576, 9, 3, 49152)


def test_unknown_hub_id_offline_gives_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(model_loader.ModelNotFoundError, match="not in the Hugging Face cache") as err:
        LLM(model="someone/not-a-cached-model")
    assert "huggingface-cli download someone/not-a-cached-model" in str(err.value)


def test_directory_without_weights_is_a_clear_error(tmp_path, embedded_dir):
    (tmp_path / "config.json").write_text((embedded_dir / "config.json").read_text())
    with pytest.raises(model_loader.ModelNotFoundError, match="no \\*.safetensors"):
        model_loader.load_model(tmp_path)


def test_unsupported_architecture_is_named(tmp_path):
    from transformers import BertConfig

    BertConfig().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model_type 'bert' is not supported"):
        model_loader.load_model(tmp_path)


def test_malformed_model_id_gives_a_clear_error():
    with pytest.raises(model_loader.ModelNotFoundError, match="is not a local directory"):
        model_loader.resolve_model("not a valid id / at all")


def test_weights_are_built_in_the_dtype_asked_for(embedded_dir):
    """A bfloat16 model never holds a float32 parameter (on a GPU that copy would stay in the allocator's cache and
    shrink the KV cache), and it equals the float32 model cast afterwards, buffers included."""
    born = []
    hook = torch.nn.modules.module.register_module_parameter_registration_hook(
        lambda module, name, param: born.append(param.dtype))
    try:
        model = model_loader.load_model(embedded_dir, torch.bfloat16)
    finally:
        hook.remove()
    assert born and set(born) == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32
    cast = model_loader.load_model(embedded_dir, torch.float32).to(torch.bfloat16)
    for (name, got), (_, want) in zip([*model.named_parameters(), *model.named_buffers()],
                                      [*cast.named_parameters(), *cast.named_buffers()]):
        assert got.dtype == want.dtype and torch.equal(got, want), name
