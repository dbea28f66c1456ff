"""Issue 32 item 4: fp16 with --stages K checks gradients that live on K GPUs (one device-mismatch error
on the first step before the fix). Needs 2 GPUs; the CPU case is covered by the one-rank tests."""
import pytest
import torch
from torch import nn

from hvdtrain.train.nonfinite import gradients_finite
from hvdtrain.train.progress import Progress


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs: gradients of a 2-stage model on two "
                    "devices (no GPU has been available to this project yet)")
def test_gradients_on_two_gpus_are_checked_without_a_device_error():
    model = nn.Sequential(nn.Linear(2, 2).to("cuda:0"), nn.Linear(2, 2).to("cuda:1"))
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    assert gradients_finite(model, None, Progress(), limit=1)
