"""Model compression for inference: int8 quantization (torchao), structured pruning, distillation.

Not to be confused with `--compression fp16`, which compresses gradients on the wire while training.
Each method reads a finished run directory and writes a new one: the compressed model exported with
torch.export (`model.pt2`, loads with plain torch), its weights (`compressed.pt`), the config, and a
report measured side by side with the original (report.json, report.txt, report.png).

Entry points: `hvdtrain.compress(...)` (hvdtrain.compression.compress_api) and `hvdtrain compress RUN_DIR`.
Model code never imports Horovod; the distributed steps (fine-tune, distillation) use the Trainer.
"""
