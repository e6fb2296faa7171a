import json

import pytest

from serve_app.tools.model_prep import DONE_MARKER, is_prepared, prepare_smollm2, shipped_gguf_path


def test_the_gguf_ships_in_the_installed_wheel():
    path = shipped_gguf_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_prepare_is_a_no_op_once_marked(tmp_path):
    (tmp_path / DONE_MARKER).write_text(json.dumps({"source": "x"}))
    assert is_prepared(tmp_path)
    assert prepare_smollm2(tmp_path) == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == [DONE_MARKER]


def test_unprepared_directory_is_not_mistaken_for_a_model(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert not is_prepared(tmp_path)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
def test_prepared_checkpoint_is_plain_hf_without_gguf_marker(name):
    from tests.conftest import REPO

    model_dir = REPO / "models" / "SmolLM2-135M-Instruct"
    if not is_prepared(model_dir):
        pytest.skip("model not prepared (run scripts/setup_env.sh)")
    assert (model_dir / name).is_file()
    config = json.loads((model_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]


def test_w8a8_checkpoint_quantizes_every_linear_layer_per_channel(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from serve_app.tools.model_prep import W8A8_INT8_CONFIG, quantize_w8a8_int8

    src, dest = tmp_path / "bf16", tmp_path / "int8"
    src.mkdir()
    torch.manual_seed(0)
    weights = {
        "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 32).to(torch.bfloat16),
        "model.layers.0.mlp.down_proj.weight": torch.randn(32, 64).to(torch.bfloat16),
        "model.embed_tokens.weight": torch.randn(100, 32).to(torch.bfloat16),
        "model.norm.weight": torch.ones(32).to(torch.bfloat16),
    }
    save_file(weights, src / "model.safetensors")
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (src / "tokenizer.json").write_text("{}")
    (src / DONE_MARKER).write_text("{}")

    quantize_w8a8_int8(src, dest)
    out = load_file(dest / "model.safetensors")
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"):
        q, scale = out[name + ".weight"], out[name + ".weight_scale"]
        original = weights[name + ".weight"].float()
        assert q.dtype == torch.int8 and scale.shape == (original.shape[0], 1)
        assert q.abs().max() == 127  # each row's largest weight maps to the full range
        assert (q.float() * scale - original).abs().max() <= scale.max() / 2 + 1e-6
    assert out["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert json.loads((dest / "config.json").read_text())["quantization_config"] == W8A8_INT8_CONFIG
    assert (dest / "tokenizer.json").is_file() and is_prepared(dest)


def test_w8a8_needs_a_prepared_source(tmp_path):
    from serve_app.tools.model_prep import quantize_w8a8_int8

    with pytest.raises(FileNotFoundError, match="not a prepared checkpoint"):
        quantize_w8a8_int8(tmp_path / "missing", tmp_path / "out")
