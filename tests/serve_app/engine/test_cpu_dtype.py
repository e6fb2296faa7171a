import logging

import pytest

from serve_app.engine.cpu_dtype import cpu_flags, resolve_cpu_dtype

AVX2_ONLY = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse sse2 avx avx2 fma\n\nprocessor\t: 1\n"
AMX = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n"


@pytest.mark.parametrize("text, expected", [(AVX2_ONLY, "float32"), (AMX, "bfloat16"), (ARM, "bfloat16")])
def test_auto_follows_native_bf16_support(tmp_path, text, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    resolved = resolve_cpu_dtype("auto", cpu_flags(cpuinfo))
    assert resolved.dtype == expected
    assert resolved.reason.startswith("auto")


def test_missing_cpuinfo_means_no_flags_and_float32(tmp_path):
    flags = cpu_flags(tmp_path / "absent")
    assert flags == frozenset()
    assert resolve_cpu_dtype("auto", flags).dtype == "float32"


def test_an_explicit_dtype_is_kept_and_emulated_bf16_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING):
        emulated = resolve_cpu_dtype("bfloat16", frozenset({"avx2"}))
    assert emulated.dtype == "bfloat16" and "emulated" in emulated.reason
    assert "without native bf16" in caplog.text
    assert resolve_cpu_dtype("float32", frozenset({"amx_bf16"})).dtype == "float32"


def test_this_machine_resolves_to_a_concrete_dtype():
    assert resolve_cpu_dtype("auto", cpu_flags()).dtype in ("bfloat16", "float32")
