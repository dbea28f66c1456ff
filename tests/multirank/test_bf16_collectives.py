"""Tier 3: Horovod's own collectives on bfloat16 tensors, 2 real workers under Gloo and MPI (hvdtrain's patched
Horovod: scripts/horovod/patches, 0007). The rank script tests/ranks/bf16_collectives.py checks each against float32."""
from __future__ import annotations

import pytest
from support.processes import BACKENDS, horovodrun, show

from hvdtrain.distributed import runtime


@pytest.mark.skipif(runtime.hvd is None or not runtime.native_bf16(),
                    reason="this Horovod has no bfloat16 (built without hvdtrain's patch): re-run make setup")
@BACKENDS
def test_bf16_collectives_equal_float32_to_bf16_precision(backend):
    proc = horovodrun(2, ["tests/ranks/bf16_collectives.py"], backend)
    assert proc.returncode == 0, show(proc)
    assert (proc.stdout + proc.stderr).count("bf16 collectives OK") == 2, show(proc)
