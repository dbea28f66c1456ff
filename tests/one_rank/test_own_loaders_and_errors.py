"""Tier 2: a user's own objects on one real Horovod worker: DataLoaders, collate functions, models that
compute their own loss, and the one-line errors for what cannot work (each naming its fix)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from sequences import Bag, DigitTokens, pad
from support.paths import ROOT
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler, TensorDataset, WeightedRandomSampler

import hvdtrain
from hvdtrain.errors import UserError


def config(**values):
    return hvdtrain.load_config(**{"epochs": 1, "run_dir": "", "threads": 1, "lr": 0.05, **values})


def small() -> DigitTokens:
    return DigitTokens(list(range(200)))


def test_a_dataloaders_batch_size_collate_and_order_are_kept(one_worker):
    loader = DataLoader(small(), batch_size=8, shuffle=False, collate_fn=pad)
    trainer = hvdtrain.Trainer(Bag(), loader, config=config(batch_size=64))
    assert trainer.config.batch_size == 8 and trainer.steps_per_epoch == 25
    assert trainer.loader.collate_fn is pad and list(trainer.source)[:5] == [0, 1, 2, 3, 4]   # shuffle=False
    history = trainer.fit()
    assert history[-1]["train_samples"] == 200 and "train_acc" in history[-1]      # accuracy from the logits


def test_drop_last_keeps_whole_batches_and_the_epoch_still_ends(one_worker):
    trainer = hvdtrain.Trainer(Bag(), DataLoader(small(), batch_size=16, shuffle=True, collate_fn=pad,
                                                 drop_last=True), config=config())
    assert trainer.steps_per_epoch == 12
    history = trainer.fit()
    assert history[-1]["train_samples"] == 192 and history.summary["steps"] == 12


def test_collate_fn_for_a_dataset_from_the_trainer_or_the_config(one_worker):
    assert hvdtrain.Trainer(Bag(), small(), collate_fn=pad, config=config()).fit()[-1]["train_samples"] == 200
    trained = hvdtrain.Trainer(Bag(), small(), config=config(collate_fn="sequences:pad")).fit()
    assert trained[-1]["train_samples"] == 200


class Pictures(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        from PIL import Image

        return Image.new("L", (8, 8)), i


@pytest.mark.parametrize("make, message", [
    (lambda: (torch.nn.Linear(64, 10), Pictures(), {}),
     r"the samples hold PIL images .*add a transform that makes tensors to the dataset, e.g. "
     r"transform=torchvision.transforms.ToTensor\(\)"),
    (lambda: (Bag(), small(), {}), r"torch's default collate cannot batch samples of dict\(input_ids: list.*pass a "
                                   r"collate_fn \(to the Trainer, or in your DataLoader\)"),
    (lambda: (Bag(), small(), {"collate_fn": lambda items: 1 / 0}),
     r"collate_fn .*<lambda> failed on the first 2 samples \(dict\(.*\)\): ZeroDivisionError: division by zero"),
    (lambda: (torch.nn.Linear(4, 3), TensorDataset(torch.randn(8, 4), torch.arange(8).flip(0)), {}),
     r"labels go up to 7, but the model outputs 3 classes \(labels must be 0..2\): build the model with at "
     r"least 8 outputs"),
    (lambda: (torch.nn.Linear(4, 3), DataLoader(TensorDataset(torch.randn(8, 4), torch.arange(8) % 3),
                                                batch_sampler=BatchSampler(SequentialSampler(range(8)), 4, False)), {}),
     r"the train DataLoader batches with a custom batch_sampler \(BatchSampler\).*give it batch_size= and shuffle="),
    (lambda: (torch.nn.Linear(4, 3), DataLoader(TensorDataset(torch.randn(8, 4), torch.arange(8) % 3), batch_size=4,
                                                sampler=WeightedRandomSampler([1.0] * 8, 8)), {}),
     r"the train DataLoader has a WeightedRandomSampler, which hvdtrain cannot split across workers"),
])
def test_what_cannot_train_is_one_line_naming_the_fix(one_worker, make, message):
    model, data, kwargs = make()
    with pytest.raises(UserError, match=message) as err:
        hvdtrain.Trainer(model, data, config=config(), **kwargs)
    assert "\n" not in str(err.value)


def test_safetensors_weights_load_without_pickle_into_a_fresh_model(tmp_path, one_worker):
    from safetensors.torch import load_file

    torch.manual_seed(0)
    model = Bag()
    trainer = hvdtrain.Trainer(model, small(), collate_fn=pad,
                               config=config(run_dir=str(tmp_path), name="st", monitor="val_acc"),
                               val_data=DigitTokens(list(range(200, 260))))
    trainer.fit()
    fresh = Bag()
    fresh.load_state_dict(load_file(tmp_path / "st" / "model.safetensors"))
    batch = pad([DigitTokens(list(range(300, 308)))[i] for i in range(8)])
    model.eval()
    fresh.eval()
    torch.testing.assert_close(fresh(**batch)["logits"], model(**batch)["logits"], rtol=0, atol=0)
    assert load_file(tmp_path / "st" / "best.safetensors").keys() == model.state_dict().keys()


def test_launch_at_a_scripts_top_level_without_the_main_guard_is_one_line(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import hvdtrain\n\ndef work():\n    return 1\n\nprint(hvdtrain.launch(work, np=2))\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and 'put the call under `if __name__ == "__main__":`' in lines[0], proc.stderr
    assert f"top level of {script} (line 6)" in lines[0]


def test_a_label_out_of_range_after_the_first_batch_is_the_same_one_line(one_worker):
    data = TensorDataset(torch.randn(64, 4), torch.cat([torch.zeros(32, dtype=torch.long), torch.full((32,), 5)]))
    trainer = hvdtrain.Trainer(torch.nn.Linear(4, 3), DataLoader(data, batch_size=32), config=config())
    with pytest.raises(UserError, match=r"labels go up to 5, but the model outputs 3 classes"):
        trainer.fit()
