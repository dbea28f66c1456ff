"""Rank-side: what users bring, trained by hvdtrain on every rank (tests/multirank/test_user_loaders.py).

    python user_loaders.py MODE OUT [BATCH MAX_STEPS]

loader: their DataLoader (padding collate_fn, 2 loader workers, shuffle) and a model that returns its
own loss; bert: a tiny BertForSequenceClassification with variable-length inputs, no step_fn, then
from_pretrained(run/hf); hf_stream / wds: a Hugging Face IterableDataset of 10 shards and a webdataset
of tar shards (WDS_SHARDS) in hvdtrain's Stream. Rank 0 writes OUT (JSON).
"""
import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins"))

from sequences import Bag, bert_pad, pad, split, tiny_bert  # noqa: E402

import hvdtrain  # noqa: E402
from hvdtrain.data.streams import Stream  # noqa: E402
from hvdtrain.distributed import runtime  # noqa: E402

mode, out = sys.argv[1], Path(sys.argv[2])
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 16
max_steps = int(sys.argv[4]) if len(sys.argv) > 4 else 0
run_dir = str(out.parent / "runs") if mode == "bert" else ""
config = hvdtrain.load_config(epochs=2, batch_size=batch, lr=0.05, lr_scaling="none", warmup_epochs=0,
                              max_steps=max_steps, threads=1, run_dir=run_dir, name=mode, optimizer="sgd",
                              log_interval=1000)
torch.manual_seed(config.seed)
train, val = split()
report: dict = {}
if mode == "loader":
    loader = DataLoader(train, batch_size=batch, shuffle=True, collate_fn=pad, num_workers=2)
    trainer = hvdtrain.Trainer(Bag(), loader, DataLoader(val, batch_size=64, collate_fn=pad), config=config)
elif mode == "bert":
    config = hvdtrain.load_config(epochs=4, batch_size=batch, lr=0.004, optimizer="adam", warmup_epochs=0,
                                  lr_scaling="none", threads=1, run_dir=run_dir, name=mode, log_interval=1000)
    trainer = hvdtrain.Trainer(tiny_bert(), DataLoader(train, batch_size=batch, shuffle=True, collate_fn=bert_pad),
                               DataLoader(val, batch_size=64, collate_fn=bert_pad), config=config)
elif mode == "hf_stream":
    from datasets import IterableDataset

    def rows(shards):
        for shard in shards:
            yield from (train[i] for i in range(shard * 100, shard * 100 + 100))

    stream = IterableDataset.from_generator(rows, gen_kwargs={"shards": list(range(10))})
    trainer = hvdtrain.Trainer(Bag(), Stream(stream, samples=1000), collate_fn=pad, config=config)
elif mode == "wds":
    import os

    import webdataset as wds

    urls = sorted(str(p) for p in Path(os.environ["WDS_SHARDS"]).glob("*.tar"))
    stream = (wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node, empty_check=False)
              .decode().map(lambda s: s["json"]))
    trainer = hvdtrain.Trainer(Bag(), Stream(stream, samples=int(os.environ["WDS_SAMPLES"])), collate_fn=pad,
                               config=config)
else:
    raise SystemExit(f"unknown mode {mode}")
history = trainer.fit()
world = runtime.world()
if mode == "bert" and world.is_root:
    from transformers import BertForSequenceClassification

    loaded = BertForSequenceClassification.from_pretrained(Path(history.summary["run_dir"]) / "hf").eval()
    trainer.model.eval()
    inputs = {k: v for k, v in bert_pad([val[i] for i in range(32)]).items() if k != "labels"}
    with torch.no_grad():
        report["hf_max_diff"] = float((loaded(**inputs).logits - trainer.model(**inputs).logits).abs().max())
if world.is_root:
    out.write_text(json.dumps({**report, "history": list(history), "size": world.size,
                               "rank_steps": history.summary["rank_steps"],
                               "digests": history.summary["param_digests"]}))
    torch.save(trainer.model.state_dict(), out.with_suffix(".pt"))
