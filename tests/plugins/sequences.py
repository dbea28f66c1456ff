"""Variable-length token sequences (scikit-learn's digits as tokens), a padding collate function and two
models that compute their own loss (a small bag-of-embeddings and a tiny BERT): what an NLP user brings."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from hvdtrain.data.datasets import digits_arrays
from hvdtrain.environment import process

VOCAB = 64 * 17 + 2          # (pixel, intensity) pairs, plus padding (0) and a [CLS]-like start token (1)


class DigitTokens(Dataset):
    """Each digit image as the tokens of its non-zero pixels: 20-60 tokens, different per sample."""

    def __init__(self, indices: list[int] | None = None) -> None:
        images, labels = digits_arrays()  # load_digits()'s arrays, without importing scikit-learn in each rank
        pixels = images.flatten(1).to(torch.long)
        order = indices if indices is not None else list(range(len(pixels)))
        self.items = []
        for i in order:
            nonzero = pixels[i].nonzero().flatten()
            tokens = [1] + (2 + nonzero * 17 + pixels[i][nonzero]).tolist()
            self.items.append({"input_ids": tokens, "label": int(labels[i]), "idx": i})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def split(seed: int = 0) -> tuple[DigitTokens, DigitTokens]:
    order = torch.randperm(1797, generator=torch.Generator().manual_seed(seed)).tolist()
    return DigitTokens(order[:1437]), DigitTokens(order[1437:])


def pad(samples: list[dict]) -> dict:
    """Pad to the longest sequence of the batch, as transformers' DataCollatorWithPadding does."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, :len(sample["input_ids"])] = torch.tensor(sample["input_ids"])
        mask[row, :len(sample["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([s["label"] for s in samples]),
            "idx": torch.tensor([s["idx"] for s in samples])}


class Bag(nn.Module):
    """Mean of token embeddings (padding masked out), then a linear layer; returns {"loss", "logits"}.

    While training it records which samples each step saw (SEQ_LOG=folder: one file per process), so a
    test can check that every sample is trained once per epoch.
    """

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.head = nn.Linear(dim, 10)
        self.seen: list[list[int]] = []

    def forward(self, input_ids, attention_mask, labels=None, idx=None):
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1)
        logits = self.head(pooled)
        if self.training and idx is not None:
            self.record(idx.tolist())
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}

    def record(self, indices: list[int]) -> None:
        folder = os.environ.get("SEQ_LOG")
        if folder:
            with (Path(folder) / f"seen.{os.getpid()}.jsonl").open("a") as handle:
                handle.write(json.dumps({"rank": process.current().rank, "idx": indices}) + "\n")


def tiny_bert(num_labels: int = 10):
    """A 2-layer BERT built from a config: no download."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=80, num_labels=num_labels)
    return BertForSequenceClassification(config)


def bert_pad(samples: list[dict]) -> dict:
    """pad() without the bookkeeping column: BERT's forward takes only its own arguments."""
    batch = pad(samples)
    del batch["idx"]
    return batch
