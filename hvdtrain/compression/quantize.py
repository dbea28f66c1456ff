"""int8 with torchao: dynamic (or weight-only) for Linear layers, static PT2E for convolutional models.

torch.ao.quantization (quantize_dynamic and friends) is deprecated; torchao's `quantize_` and its PT2E
flow with the X86InductorQuantizer replace it. A layer or model that cannot be quantized stays in
float32 and the returned notes say which and why (they go into the report).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hvdtrain.compression.compress_options import MODES, CompressOptions
from hvdtrain.compression.export import export_program, quiet_torchao
from hvdtrain.compression.outcome import Outcome, say
from hvdtrain.data.datasets import Data
from hvdtrain.errors import UserError, first_line
from hvdtrain.trained.finished_run import FinishedRun


@dataclass
class Quantized:
    """The int8 model, how it was made, and what stayed float32."""
    model: nn.Module
    mode: str                                         # the mode actually used: dynamic, weight-only or static
    int8_layers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _torchao() -> Any:
    quiet_torchao()
    try:
        import torchao.quantization as tq
    except ImportError as err:
        raise UserError(f"int8 needs torchao ({err}); pip install -e '.[compress]' in hvdtrain's checkout "
                        "(torchao==0.18.0)") from None
    return tq


def compress(run: FinishedRun, opts: CompressOptions) -> Outcome:
    """int8 of the run's model, for the report (no training: rank 0 alone runs it)."""
    count = min(opts.calibration, len(run.data.train))
    quantized = quantize_int8(run.model, opts.int8_mode, _calibration(run.data, count))
    say(opts, f"int8 {quantized.mode}: {len(quantized.int8_layers)} layer(s) in int8")
    details = {"int8_mode": quantized.mode, "asked_mode": opts.int8_mode, "int8_layers": quantized.int8_layers,
               "calibration_samples": count if quantized.mode == "static" else 0}
    return Outcome(f"int8 ({quantized.mode})", quantized.model, run.config, details, quantized.notes)


def _calibration(data: Data, count: int) -> torch.Tensor:
    return torch.stack([data.train[i][0] for i in range(count)])


def quantize_int8(model: nn.Module, mode: str, calibration: torch.Tensor) -> Quantized:
    """An int8 copy of `model` (the original is not changed).

    Args:
        model: a trained float32 model.
        mode: auto (static for models with Conv2d layers, dynamic otherwise), dynamic (int8 weights and
            activations quantized per batch at run time), weight-only, or static (PT2E, calibrated).
        calibration: a batch of training inputs; static mode observes activation ranges on it.
    Returns:
        A Quantized: the model, the mode used, the layers in int8, and notes on any fallback.
    Example:
        >>> result = quantize_int8(trained_mlp, "auto", calibration_inputs)
        >>> result.mode, result.int8_layers
    """
    if mode not in MODES:
        raise UserError(f"int8 mode must be one of {', '.join(MODES)}; got {mode!r}")
    model = copy.deepcopy(model).eval()
    has_conv = any(isinstance(m, nn.Conv2d) for m in model.modules())
    if mode == "auto":
        mode = "static" if has_conv else "dynamic"
    if mode == "static":
        try:
            return _static(model, calibration)
        except Exception as err:
            result = _dynamic(model, "dynamic")
            result.notes.insert(0, f"static PT2E int8 failed ({type(err).__name__}: {first_line(err)}); fell back to "
                                   "dynamic int8 for Linear layers")
            return result
    return _dynamic(model, mode)


def _dynamic(model: nn.Module, mode: str) -> Quantized:
    tq = _torchao()
    config = tq.Int8DynamicActivationInt8WeightConfig() if mode == "dynamic" else tq.Int8WeightOnlyConfig()
    result = Quantized(model, mode)
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear):
            try:  # one layer at a time, so one that cannot be quantized does not stop the others
                tq.quantize_(model, config, filter_fn=lambda _m, fqn, name=name: fqn == name)
                result.int8_layers.append(name)
            except Exception as err:
                result.notes.append(f"layer {name} ({module.in_features}->{module.out_features}) stays float32: "
                                    f"{type(err).__name__}: {first_line(err, 120)}")
    convs = [name for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    if convs:
        result.notes.append(f"Conv2d layers {', '.join(convs)} stay float32: {mode} int8 covers nn.Linear only "
                            "(--int8-mode static quantizes convolutions)")
    if not result.int8_layers:
        result.notes.append("no layer could be quantized: the model is unchanged")
    return result


def _static(model: nn.Module, calibration: torch.Tensor) -> Quantized:
    _torchao()
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(export_program(model, calibration[:8]).module(), quantizer)
    with torch.no_grad():
        for chunk in calibration.split(64):  # observers record activation ranges
            prepared(chunk)
    converted = convert_pt2e(prepared)
    _drop_unused_attributes(converted)
    int8 = [name for name, t in converted.state_dict().items() if t.dtype == torch.int8]
    layers = [name for name, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    result = Quantized(converted, "static", int8_layers=layers)
    if len(int8) < len(layers):
        result.notes.append(f"static PT2E quantized {len(int8)} of {len(layers)} Conv2d/Linear weights; "
                            "the rest stay float32")
    result.notes.append("static int8 runs as a reference graph (quantize/dequantize around float kernels) in "
                        "eager mode; its fused int8 kernels come from torch.compile (inductor)")
    return result


def _drop_unused_attributes(graph_module: Any) -> None:
    """convert_pt2e folds int8 weights into new constants but keeps the float32 originals: drop them."""
    used = {node.target for node in graph_module.graph.nodes if node.op == "get_attr"}
    for name in [n for n, _ in graph_module.named_parameters()] + [n for n, _ in graph_module.named_buffers()]:
        if name not in used:
            owner_path, _, leaf = name.rpartition(".")
            owner = graph_module.get_submodule(owner_path) if owner_path else graph_module
            delattr(owner, leaf)
