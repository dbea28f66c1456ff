"""Training features, tiers 1 and 2: pure functions (no Horovod), then one real Horovod worker in-process.

The multi-rank halves (accumulation equivalence, SyncBatchNorm, compression bytes, early stopping on
every rank, diagnostics) are in test_features_multirank.py.
"""
from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from support.runs import records

from hvdtrain.config.train_config import FIELD_TYPES, load_config
from hvdtrain.data.datasets import build_data
from hvdtrain.data.sharding import step_samples, steps_per_epoch
from hvdtrain.distributed import horovod_settings as settings
from hvdtrain.distributed import runtime
from hvdtrain.errors import ConfigError, UserError
from hvdtrain.models.builtin import build_model
from hvdtrain.train.config_fit import fit
from hvdtrain.train.early_stopping import improved, patience_exhausted
from hvdtrain.train.precision import autocast
from hvdtrain.train.trainer import Trainer

# --- tier 1: no Horovod -------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--precision", "fp8"], "precision must be one of fp32, bf16, fp16; got 'fp8'"),
    (["--precision", "fp16", "--device", "cpu"], "precision fp16 needs a CUDA device"),
    (["--precision", "fp16", "--elastic", "true"], "precision fp16 is not supported with elastic yet"),
    (["--accumulate", "0"], "accumulate must be > 0"),
    (["--compression", "int8"], "compression must be one of none, fp16"),
    (["--op", "sum"], "op must be one of average, adasum"),
    (["--op", "adasum"], "op adasum combines gradients adaptively and wants the one-worker LR: add --lr-scaling none"),
    (["--op", "adasum", "--lr-scaling", "none", "--gradient-predivide-factor", "2"],
     "gradient_predivide_factor applies only to op average"),
    (["--op", "adasum", "--lr-scaling", "none", "--precision", "fp16"], "cannot be combined with op adasum"),
    (["--gradient-predivide-factor", "0"], "gradient_predivide_factor must be > 0"),
    (["--monitor", "f1"], "monitor must name a held-out metric such as val_acc or val_loss, got 'f1'"),
    (["--patience", "3"], "patience needs a metric to watch: add --monitor val_acc or --monitor val_loss"),
    (["--patience", "-1", "--monitor", "val_acc"], "patience must be >= 0"),
    (["--stall-check-s", "-5"], "stall_check_s must be >= 0"),
])
def test_feature_options_are_validated_with_one_line_messages(args, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, args)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_horovod_settings_become_the_environment_hvd_init_reads(tmp_path):
    assert settings.horovod_env(load_config()) == {}  # nothing asked: horovodrun's own flags still apply
    config = load_config(None, ["--timeline-file", "t.json", "--autotune", "true", "--stall-check-s", "5",
                                "--stall-shutdown-s", "120"])
    env = settings.horovod_env(config)
    assert env == {"HOROVOD_TIMELINE": env["HOROVOD_TIMELINE"], "HOROVOD_AUTOTUNE": "1",
                   "HOROVOD_STALL_CHECK_TIME_SECONDS": "5", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "120"}
    assert env["HOROVOD_TIMELINE"].endswith("/t.json") and env["HOROVOD_TIMELINE"].startswith("/")
    assert settings.horovod_env(load_config(None, ["--stall-check-s", "0"])) == {"HOROVOD_STALL_CHECK_DISABLE": "1"}


class FakeHorovod:
    """Records the environment hvd.init() would read (Open MPI reads OMPI_MCA_* in MPI_Init there)."""

    def __init__(self) -> None:
        self.seen: dict[str, str] | None = None

    def is_initialized(self) -> bool:
        return self.seen is not None

    def init(self) -> None:
        import os

        self.seen = dict(os.environ)

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    local_rank, local_size = rank, size


@pytest.mark.parametrize("preset, expected", [(None, "1"), ("0", "0")])
def test_open_mpi_yields_when_idle_unless_the_user_says_otherwise(monkeypatch, preset, expected):
    """hvdtrain's MPI defaults (benchmarks/README.md: Horovod's background thread busy-polled most of
    a core at np=2) are in the environment when hvd.init() runs; a value already there wins."""
    fake = FakeHorovod()
    monkeypatch.setattr(runtime, "hvd", fake)
    monkeypatch.setattr(runtime, "_READ_AT_START", {})   # the fake's start is not this process's Horovod's
    monkeypatch.setattr(runtime, "_SET_FOR_START", {})
    monkeypatch.delenv("OMPI_MCA_mpi_yield_when_idle", raising=False)
    if preset is not None:
        monkeypatch.setenv("OMPI_MCA_mpi_yield_when_idle", preset)
    with runtime.started({"HOROVOD_AUTOTUNE": "1"}):
        pass
    assert fake.seen["OMPI_MCA_mpi_yield_when_idle"] == expected
    assert fake.seen["HOROVOD_AUTOTUNE"] == "1"


def test_mpi_defaults_drop_the_ofi_btl_on_one_host_only():
    yield_ = {"OMPI_MCA_mpi_yield_when_idle": "1"}
    one_host = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert settings.mpi_defaults(one_host) == {**yield_, "OMPI_MCA_btl": "^ofi"}
    # horovodrun --mpi's own `-mca btl ^openib` arrives as this variable: extended, not replaced
    assert settings.mpi_defaults({**one_host, "OMPI_MCA_btl": "^openib"}) == {**yield_, "OMPI_MCA_btl": "^openib,ofi"}
    assert settings.mpi_defaults({**one_host, "OMPI_MCA_btl": "^openib,ofi"}) == yield_
    assert settings.mpi_defaults({**one_host, "OMPI_MCA_btl": "self,tcp"}) == yield_    # a list to use: kept
    two_hosts = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert settings.mpi_defaults(two_hosts) == yield_
    assert settings.mpi_defaults({}) == yield_                                          # not under mpirun
    assert settings.mpi_defaults({**one_host, "HVDTRAIN_MPI_DEFAULTS": "yield"}) == yield_
    assert settings.mpi_defaults({**one_host, "HVDTRAIN_MPI_DEFAULTS": "0"}) == {}       # all off


def test_gloo_ops_get_a_2_ms_cycle_unless_the_user_or_autotune_chooses():
    gloo = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4321"}
    assert settings.gloo_defaults(gloo) == {"HOROVOD_CYCLE_TIME": "2"}
    assert settings.gloo_defaults({"HOROVOD_CONTROLLER": "gloo"}) == {"HOROVOD_CYCLE_TIME": "2"}
    assert settings.gloo_defaults({**gloo, "HOROVOD_CYCLE_TIME": "1"}) == {}      # the user's value
    assert settings.gloo_defaults({**gloo, "HOROVOD_AUTOTUNE": "1"}) == {}        # autotune tunes the cycle
    assert settings.gloo_defaults({**gloo, "HOROVOD_AUTOTUNE": "0"}) == {"HOROVOD_CYCLE_TIME": "2"}
    assert settings.gloo_defaults({"OMPI_COMM_WORLD_SIZE": "2"}) == {}            # MPI ops: Horovod's default
    assert settings.gloo_defaults({}) == {}


def test_every_config_key_passes_through_horovodrun_untouched(monkeypatch):
    """horovodrun parses the whole command line: a key that is an ambiguous prefix of one of its own
    options (as `--timeline` is of --timeline-filename and --timeline-mark-cycles) would be refused."""
    from horovod.runner.launch import parse_args

    for key in FIELD_TYPES:
        flag = "--" + key.replace("_", "-")
        monkeypatch.setattr(sys, "argv", ["horovodrun", "-np", "2", "python", "-m", "hvdtrain", flag, "1"])
        assert parse_args().command == ["python", "-m", "hvdtrain", flag, "1"], flag


def test_accumulation_steps_and_micro_batch_shares():
    # 250 samples per rank, micro-batches of 8: 31 full and one of 2; steps of 4 micro-batches.
    assert steps_per_epoch(500, 2, 8) == 32
    assert steps_per_epoch(500, 2, 8, accumulate=4) == 8
    assert [step_samples(m, 8, 4, 250) for m in (0, 3, 4, 27, 28, 31)] == [32, 32, 32, 32, 26, 26]
    assert [step_samples(m, 8, 1, 250) for m in (0, 30, 31)] == [8, 8, 2]  # no accumulation: its own size
    # The shares of one step add up to 1: the step's gradient is the mean over its samples.
    assert sum(n / step_samples(m, 8, 4, 250) for m, n in zip(range(28, 32), (8, 8, 8, 2), strict=True)) == 1.0


def test_monitor_direction_and_patience():
    assert improved(math.nan, 0.1, True) and improved(math.nan, 9.0, False)
    assert improved(0.5, 0.6, True) and not improved(0.5, 0.5, True)
    assert improved(0.5, 0.4, False) and not improved(0.5, 0.6, False)
    assert not improved(0.5, None, True) and not improved(0.5, math.nan, True)
    # Best at epoch 0 (0-based), patience 2: epochs 1 and 2 fail to improve, stop after 3 epochs.
    assert not patience_exhausted(2, 0, 2) and patience_exhausted(3, 0, 2)
    assert not patience_exhausted(100, 0, 0) and not patience_exhausted(5, -1, 2)


def test_autocast_runs_matmuls_in_bf16_and_is_off_for_fp32():
    layer, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
    with autocast("bf16", torch.device("cpu")):
        assert layer(x).dtype == torch.bfloat16
    with autocast("fp32", torch.device("cpu")):
        assert layer(x).dtype == torch.float32


# --- tier 2: one real Horovod worker in this process ---------------------------------------------------



MLP = ["--model", "mlp", "--epochs", "2", "--threads", "1"]


def test_same_seed_same_parameters_other_seed_other_parameters(one_worker):
    def digest(seed: str) -> str:
        summary = fit(load_config(None, [*MLP, "--seed", seed, "--run-dir", ""])).summary
        return summary["param_digests"][0]

    first = digest("7")
    assert digest("7") == first  # bit for bit: a digest of every parameter's bytes
    assert digest("8") != first


def test_an_elastic_reset_keeps_counting_steps_of_accumulated_micro_batches(one_worker):
    config = load_config(None, [*MLP, "--accumulate", "4", "--run-dir", ""])
    data = build_data(config)
    trainer = Trainer(build_model(config, (1, 8, 8), 10), data.train, data.val, config=config)
    before = trainer.steps_per_epoch
    assert before == steps_per_epoch(len(data.train), 1, config.batch_size, accumulate=4)
    trainer.loop_runner.hooks.resize(runtime.world())  # what an elastic reset does after workers join or leave
    assert trainer.steps_per_epoch == before


def test_fp16_on_a_cpu_worker_is_a_user_error_before_training(tmp_path, one_worker):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: fp16 is allowed here")
    with pytest.raises(UserError, match="precision fp16 needs a CUDA device .* on CPU use --precision bf16"):
        fit(load_config(None, [*MLP, "--precision", "fp16", "--run-dir", str(tmp_path)]))
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_fp16_loss_scaler_skips_overflows_and_is_checkpointed(tmp_path, monkeypatch, one_worker):
    """The GradScaler path (synchronize, unscale after the allreduce, step, update) on CPU float16.

    fp16 is CUDA-only for users; here the device check is lifted so the scaler logic runs on this
    CPU machine. A huge initial scale overflows for several steps in a row: more than nonfinite_limit,
    yet the run must not abort (the scaler halves the scale), and must still learn.
    """
    import hvdtrain.train.precision as precision_module

    monkeypatch.setattr(precision_module, "check_precision", lambda precision, device: None)
    monkeypatch.setattr(precision_module, "make_scaler",
                        lambda precision, device: torch.amp.GradScaler("cpu", init_scale=2.0 ** 28))
    config = load_config(None, [*MLP, "--epochs", "3", "--precision", "fp16", "--nonfinite-limit", "3",
                                "--run-dir", str(tmp_path), "--name", "fp16"])
    summary = fit(config).summary
    assert summary["skipped_steps"] > 3, summary  # overflow steps skipped, more than the limit, no abort
    assert summary["val_acc"] >= 0.85, summary
    ckpt = torch.load(sorted((tmp_path / "fp16" / "checkpoints").glob("ckpt-*.pt"))[-1], weights_only=True)
    assert 1.0 <= ckpt["scaler"]["scale"] <= 2.0 ** 28 / 2 ** summary["skipped_steps"]
    # Resuming restores the scale instead of starting over at the (overflowing) initial one.
    resumed = load_config(None, [*MLP, "--epochs", "4", "--precision", "fp16", "--run-dir", str(tmp_path),
                                 "--name", "fp16", "--resume", "auto"])
    data = build_data(resumed)
    trainer = Trainer(build_model(resumed, (1, 8, 8), 10), data.train, data.val, config=resumed)
    assert trainer.precision.scaler is not None and trainer.precision.scaler.get_scale() == ckpt["scaler"]["scale"]
    trainer.close()

def test_run_directory_has_curves_png_step_time_and_best_weights(tmp_path, capsys, one_worker):
    from matplotlib.image import imread

    fit(load_config(None, [*MLP, "--monitor", "val_loss", "--run-dir", str(tmp_path), "--name", "r"]))
    run = tmp_path / "r"
    png = (run / "curves.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    height, width, _ = imread(run / "curves.png").shape  # decodes: a real image, not just a header
    assert (width, height) == (1000, 380)
    epochs = records(run, "epoch")
    assert all(0 < r["step_time_s"] < r["epoch_time_s"] for r in epochs)
    assert "step_ms" in capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    best_epoch = min(range(len(epochs)), key=lambda i: epochs[i]["val_loss"])
    assert summary["best_epoch"] == best_epoch and summary["best"] == epochs[best_epoch]["val_loss"]
    assert torch.load(run / "best.pt", weights_only=True).keys() == torch.load(run / "model.pt").keys()


def test_tensorboard_events_are_readable(tmp_path, one_worker):
    pytest.importorskip("tensorboard", reason="the optional tensorboard package is not installed "
                                              "(pip install -e '.[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    fit(load_config(None, [*MLP, "--log-interval", "10", "--run-dir", str(tmp_path), "--name", "tb"]))
    events = EventAccumulator(str(tmp_path / "tb" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/acc", "train/lr", "epoch/val_acc", "epoch/val_loss", "epoch/step_time_s"} <= tags
    epochs = records(tmp_path / "tb", "epoch")
    val_acc = events.Scalars("epoch/val_acc")
    assert [e.step for e in val_acc] == [r["step"] for r in epochs]
    assert [e.value for e in val_acc] == pytest.approx([r["val_acc"] for r in epochs])
    assert len(events.Scalars("train/loss")) == len(records(tmp_path / "tb", "train"))


def test_monitor_needs_held_out_data(one_worker):
    from torch.utils.data import TensorDataset

    import hvdtrain

    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    with pytest.raises(UserError, match="monitor val_acc needs held-out data"):
        hvdtrain.Trainer(torch.nn.Linear(4, 2), data, config=load_config(None, ["--monitor", "val_acc",
                                                                                "--run-dir", ""]))

