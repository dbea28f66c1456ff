"""Your own model and data: batches of any structure, metrics as sums, data sources, and one-line
errors for everything still unsupported. Pure functions, then one real Horovod worker in-process."""
from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
from collections import namedtuple

import numpy as np
import pytest
import torch
from support.paths import ROOT
from torch.utils.data import IterableDataset, TensorDataset
from user_models import TinyEncoder, TwoHeads, dict_digits, dict_step, two_heads_loss  # noqa: E402

import hvdtrain
from hvdtrain.data.datasets import build_data
from hvdtrain.errors import UserError
from hvdtrain.train.batch import batch_len, describe, to_device
from hvdtrain.train.metrics import ErrorMean, MetricSet, TopK, by_name
from hvdtrain.train.signals import agreed_signal, stop_flags

Pair = namedtuple("Pair", "x y")


@dataclasses.dataclass
class Sample:
    pixels: torch.Tensor
    name: str


def test_batches_of_any_structure_move_tensors_and_keep_the_rest():
    batch = {"a": [torch.ones(2), ("id", torch.zeros(2, 3))], "p": Pair(torch.ones(4), 7),
             "s": Sample(torch.ones(4, 1), "x"), "none": None}
    moved = to_device(batch, torch.device("cpu"))
    assert isinstance(moved["p"], Pair) and moved["p"].y == 7
    assert isinstance(moved["s"], Sample) and moved["s"].name == "x"
    assert moved["a"][1][0] == "id" and moved["none"] is None
    assert batch_len(batch) == 2 and batch_len((torch.ones(5, 2), torch.ones(5))) == 5
    assert describe({"features": torch.ones(32, 64), "label": torch.ones(32)}) == \
        "dict(features: Tensor[32, 64], label: Tensor[32])"


def test_top5_accuracy_equals_a_hand_computation():
    torch.manual_seed(0)
    outputs, targets = torch.randn(50, 10), torch.randint(0, 10, (50,))
    by_hand = sum(int(t) in o.argsort(descending=True)[:5].tolist() for o, t in zip(outputs, targets, strict=True))
    metrics = MetricSet([TopK(1), by_name("top5_acc")])
    sums = metrics.batch_sums(torch.tensor(1.0), 50, {}, outputs, targets)
    values = metrics.values(sums, prefix="val_")
    assert values["val_top5_acc"] == by_hand / 50
    assert values["val_acc"] == int((outputs.argmax(1) == targets).sum()) / 50


def test_mse_and_mae_and_sums_over_unequal_shards_equal_the_whole():
    torch.manual_seed(1)
    outputs, targets = torch.randn(101, 1), torch.randn(101)
    metrics = MetricSet([ErrorMean("mse", 2), ErrorMean("mae", 1)])
    whole = metrics.batch_sums(torch.tensor(0.0), 101, {}, outputs, targets)
    parts = [metrics.batch_sums(torch.tensor(0.0), len(targets[s]), {}, outputs[s], targets[s])
             for s in (slice(0, 51), slice(51, 101))]  # 51 + 50, as two ranks would hold them
    joined = parts[0] + parts[1]
    assert joined[1] == whole[1] == 101 and joined[3] == joined[5] == 101  # counts: exact
    torch.testing.assert_close(joined, whole, rtol=1e-12, atol=0)       # float64 sums: to rounding
    values = metrics.values(whole)
    assert values["mse"] == pytest.approx(((outputs.squeeze(1) - targets) ** 2).mean().item(), rel=1e-6)
    assert values["mae"] == pytest.approx((outputs.squeeze(1) - targets).abs().mean().item(), rel=1e-6)


def test_training_batches_added_at_once_equal_batch_sums_one_by_one():
    """The trainer keeps a log interval's batches as parts and adds them in a few ops (add_parts): the
    same layout and values as adding batch_sums batch by batch, step_fn values and unequal batches included."""
    with torch.random.fork_rng():   # the tests after this one see the RNG as before it
        torch.manual_seed(2)
        check_added_at_once()


def check_added_at_once():
    metrics = MetricSet([TopK(1), by_name("top5_acc")], extras=["aux"])
    one_by_one, parts = metrics.zeros(), []
    for n in (32, 32, 7):
        outputs = torch.randn(n, 10, requires_grad=True)
        targets = torch.randint(0, 10, (n,))
        loss = torch.nn.functional.cross_entropy(outputs, targets)
        one_by_one += metrics.batch_sums(loss, n, {"aux": loss * 2}, outputs, targets)
        parts.append(metrics.batch_parts(loss, n, {"aux": loss * 2}, outputs, targets))
        assert not parts[-1][0].requires_grad and not parts[-1][2][0].requires_grad  # no graph kept alive
    start = torch.arange(float(metrics.size), dtype=torch.float64)
    added = metrics.add_parts(start, parts)
    torch.testing.assert_close(added, start + one_by_one, rtol=1e-12, atol=0)
    assert added[1] == start[1] + 71 and added[4] == start[4] + 71        # counts: exact
    assert metrics.add_parts(start, []) is start
    regression = MetricSet([ErrorMean("mse", 2)])
    outputs, targets = torch.randn(9, 1), torch.randn(9)
    parts = [regression.batch_parts(torch.tensor(0.5), 9, {}, outputs, targets)]
    torch.testing.assert_close(regression.add_parts(regression.zeros(), parts),
                               regression.batch_sums(torch.tensor(0.5), 9, {}, outputs, targets))


def test_stop_signal_is_the_maximum_not_the_mean():
    """Review defect: SIGTERM on 1 of 2 ranks was summed and divided by 2 -> 7 (SIGBUS), exit 135."""
    summed = [a + b for a, b in zip(stop_flags(signal.SIGTERM), stop_flags(0), strict=True)]
    assert agreed_signal(summed) == signal.SIGTERM
    both = [a + b for a, b in zip(stop_flags(signal.SIGINT), stop_flags(signal.SIGTERM), strict=True)]
    assert agreed_signal(both) == signal.SIGTERM and agreed_signal(stop_flags(0)) == 0


# ---- one real Horovod worker, in-process

def config(**values):
    return hvdtrain.load_config(**{"epochs": 3, "run_dir": "", "threads": 1, "lr": 0.05, **values})


def test_dict_batches_with_step_fn_and_tuple_outputs_with_loss_fn_train(one_worker):
    # Seeded: the model is built before the Trainer seeds anything, and after 5 epochs val_batch_acc
    # ranged 0.79-0.88 over initial weights (seeds 0-5): 0.8 failed whenever an earlier test moved the RNG.
    torch.manual_seed(0)
    train, val, _ = dict_digits(config())
    history = hvdtrain.Trainer(TinyEncoder(), train, val, step_fn=dict_step,
                               config=config(optimizer="adam", lr=0.003, epochs=5)).fit()
    assert history[-1]["val_batch_acc"] > 0.7 and history[-1]["train_loss"] < history[0]["train_loss"]
    data = build_data(config())
    history = hvdtrain.Trainer(TwoHeads(), data.train, data.val, loss_fn=two_heads_loss,
                               config=config(metrics="acc,top5_acc", monitor="val_top5_acc")).fit()
    assert history[-1]["val_acc"] > 0.8 and history[-1]["val_top5_acc"] >= history[-1]["val_acc"]


def test_regression_on_a_parquet_table_reports_mse_and_mae_not_accuracy(tmp_path, one_worker):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3)).astype(np.float32)
    pq.write_table(pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "y": x @ [1.0, -2.0, 0.5]}),
                   tmp_path / "r.parquet")
    history = hvdtrain.fit(config(dataset=f"parquet:{tmp_path / 'r.parquet'}", label="y", model="mlp",
                                  epochs=15, warmup_epochs=0, monitor="val_mse"))
    last = history[-1]
    assert "val_acc" not in last and last["val_mse"] < 0.1 and last["val_mae"] < 0.3, last
    assert history.summary["best"] <= last["val_mse"]


class Unsized(IterableDataset):
    def __len__(self):
        return 10

    def __iter__(self):
        return iter([(torch.ones(3), 0)] * 10)


@pytest.mark.parametrize("case, message", [
    ("dict batch, no step_fn", r"default step takes \(inputs, targets\) pairs, but a batch is dict\(features: "
                               r"Tensor\[2, 64\], label: Tensor\[2\], id: list\(str, str\)\); pass step_fn="),
    ("tuple outputs, default loss", r"loss_fn\(model\(inputs\), targets\) failed on a batch of list\(.*\): "
                                    r"TypeError: .*; pass step_fn="),
    ("step_fn returns a vector", r"the loss must be a scalar float tensor .* got Tensor\[2\]; return it from step_fn"),
    ("unknown metric", r"unknown metric 'f1'; built-ins are acc, topK_acc"),
    ("top5 of 3 classes", r"metric top5_acc does not fit outputs \(2, 3\)"),
    ("stream without sharding", r"train_data is an IterableDataset \(Unsized\) without reshard"),
    ("monitor not a metric", r"monitor val_f1 is not a held-out metric of this run; choose one of val_loss, val_acc"),
])
def test_unsupported_inputs_are_one_line_errors_naming_the_fix(case, message, one_worker):
    digits = build_data(config())
    three = TensorDataset(torch.randn(20, 4), torch.randint(0, 3, (20,)))
    make = {
        "dict batch, no step_fn": lambda: hvdtrain.Trainer(TinyEncoder(), dict_digits(config())[0], config=config()),
        "tuple outputs, default loss": lambda: hvdtrain.Trainer(TwoHeads(), digits.train, config=config()),
        "step_fn returns a vector": lambda: hvdtrain.Trainer(
            TinyEncoder(), dict_digits(config())[0], step_fn=lambda m, b: m(b["features"]).sum(1), config=config()),
        "unknown metric": lambda: hvdtrain.Trainer(torch.nn.Linear(4, 3), three, config=config(metrics="acc,f1")),
        "top5 of 3 classes": lambda: hvdtrain.Trainer(torch.nn.Linear(4, 3), three, config=config(metrics="top5_acc")),
        "stream without sharding": lambda: hvdtrain.Trainer(torch.nn.Linear(3, 2), Unsized(), config=config()),
        "monitor not a metric": lambda: hvdtrain.Trainer(torch.nn.Linear(4, 3), three, three,
                                                         config=config(monitor="val_f1")),
    }[case]
    with pytest.raises(UserError, match=message) as err:
        make()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("args, message", [
    (["--dataset", "csv:{tmp}/t.csv", "--label", "nope"], "column(s) nope not in the data (columns: a, b, kind)"),
    (["--dataset", "csv:{tmp}/t.csv", "--label", "b"], "feature column kind is not numeric"),
    (["--dataset", "images:{tmp}/empty"], "has no class folders"),
    (["--dataset", "shards:{tmp}/none-*.parquet"], "match 0 file(s); streaming needs at least 2"),
    (["--model", "torchvision:resnet18", "--dataset", "synthetic", "--synthetic-shape", "3,16,16"], "torchvision"),
    (["--metrics", "acc,bogus"], "unknown metric 'bogus'"),
])
def test_data_mistakes_on_the_command_line_exit_2_in_one_line(tmp_path, args, message):
    (tmp_path / "t.csv").write_text("a,b,kind\n1,2.5,x\n3,4.5,y\n5,6.5,x\n")
    (tmp_path / "empty").mkdir()
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", *args, "--epochs", "1", "--run-dir", str(tmp_path / "r")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    if "torchvision" in args[1] and proc.returncode == 0:
        pytest.skip("torchvision imports here: the zoo model trained")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hvdtrain: error: ") and message in lines[0], proc.stderr
    assert not (tmp_path / "r").exists()  # nothing written
