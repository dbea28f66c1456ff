"""bf16 at the Horovod seam without Horovod running: `--compression bf16`'s compressor, and its refusal where the
installed Horovod lacks hvdtrain's bfloat16 patch (scripts/horovod/patches/0007-bfloat16-data-type.patch)."""
from __future__ import annotations

import pytest
import torch

from hvdtrain.distributed import gradients, runtime, wire
from hvdtrain.errors import UserError


def test_bf16_compression_sends_float_gradients_as_bf16_and_restores_their_dtype():
    for dtype in (torch.float32, torch.float64, torch.float16):
        grad = torch.tensor([1.0, -3.5, 1e-3, 3e38 if dtype != torch.float16 else 6e4], dtype=dtype)
        sent, ctx = wire.Bf16Compressor.compress(grad)
        assert sent.dtype == torch.bfloat16
        assert torch.isfinite(sent.float()).all()        # fp32's range: 3e38 survives (fp16 would be inf)
        back = wire.Bf16Compressor.decompress(sent, ctx)
        assert back.dtype == dtype
        torch.testing.assert_close(back.double(), grad.double(), rtol=2 ** -8, atol=0)
    for other in (torch.tensor([1, 2]), torch.ones(2, dtype=torch.bfloat16)):
        assert wire.Bf16Compressor.compress(other) == (other, None)


def test_bf16_compression_halves_the_bytes_of_fp32():
    grad = torch.randn(1000)
    sent, _ = wire.Bf16Compressor.compress(grad)
    assert sent.numel() * sent.element_size() * 2 == grad.numel() * grad.element_size()


def test_bf16_compression_without_horovods_bfloat16_is_one_line_naming_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(gradients, "native_bf16", lambda: False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # torch sets it the first time it builds an optimizer
    model = torch.nn.Linear(2, 2)
    with pytest.raises(UserError) as err:
        gradients.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, compression="bf16")
    message = str(err.value)
    assert "\n" not in message and "compression bf16" in message and "make setup" in message


def test_without_horovods_bfloat16_bf16_travels_as_fp32_and_with_it_as_itself(monkeypatch):
    weights = torch.ones(3, dtype=torch.bfloat16)
    monkeypatch.setattr(wire, "native_bf16", lambda: False)
    assert wire.widen(weights).dtype == torch.float32 and wire.no_compression() is wire.Bf16AsFp32
    monkeypatch.setattr(wire, "native_bf16", lambda: True)
    assert wire.widen(weights) is weights and wire.no_compression() is runtime.hvd.Compression.none


def test_the_seam_and_the_installer_look_for_the_same_binding():
    """The name the seam looks up is the one the installer checks and the one patch 0007 binds."""
    import install_plan

    assert runtime.BF16_BINDING == install_plan.BF16_BINDING
    bf16_patch = next(path for path in install_plan.series() if "bfloat16" in path.name)
    assert f'+  m.def("{runtime.BF16_BINDING}", &DoAllreduce);' in bf16_patch.read_text()
