"""Elastic Horovod's state (Horovod's TorchState, through distributed/elastic_state.py) with bf16 weights and bf16
optimizer state, on one real Horovod rank: commit saves them, restore brings them back bit for bit, and sync (rank
0's broadcast after a reset) carries them, whether Horovod has bfloat16 (hvdtrain's patched build) or not (then
they travel as float32: Horovod's own handlers would raise "Tensor type torch.BFloat16Tensor is not supported.")."""
from __future__ import annotations

import pytest
import torch

from hvdtrain.distributed import elastic_state, runtime, wire


@pytest.mark.parametrize("native", [True, False], ids=["horovod-bf16", "through-fp32"])
def test_elastic_state_saves_restores_and_syncs_bf16_weights_and_momentum(one_worker, monkeypatch, tmp_path, native):
    if native and not runtime.native_bf16():
        pytest.skip("this Horovod has no bfloat16 (built without hvdtrain's patch): re-run make setup")
    if not native:
        for module in (elastic_state, wire):
            monkeypatch.setattr(module, "native_bf16", lambda: False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))   # torch sets it the first time it steps
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 4, dtype=torch.bfloat16)).float().square().sum().backward()
    optimizer.step()                                             # bf16 momentum buffers now exist
    state = elastic_state.elastic_state(model, optimizer, progress={"step": 1})
    state.commit()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    assert all(m.dtype == torch.bfloat16 for m in momentum)

    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    model(torch.randn(8, 4, dtype=torch.bfloat16)).float().sum().backward()
    optimizer.step()
    state.progress = {"step": 2}
    state.restore()
    state.sync()
    after = model.state_dict()
    assert state.progress == {"step": 1}
    for key, value in weights.items():
        assert after[key].dtype == value.dtype and torch.equal(after[key], value), key
    for p, saved in zip(model.parameters(), momentum, strict=True):
        buf = optimizer.state[p]["momentum_buffer"]
        assert buf.dtype == torch.bfloat16 and torch.equal(buf, saved)
