import json

import pytest

from serve_app.model_prep import DONE_MARKER, is_prepared, prepare_smollm2, shipped_gguf_path


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
