"""`errors.first_line`, and every error path that quotes a library's exception still gives one line when
the exception's message is empty (the old `str(err).splitlines()[0]` raised IndexError instead)."""
from __future__ import annotations

import sys
import types

import pytest

from hvdtrain.errors import UserError, first_line


def one_line(err: pytest.ExceptionInfo[UserError]) -> str:
    text = str(err.value)
    assert text and "\n" not in text, repr(text)
    return text


@pytest.mark.parametrize("err, expected", [
    (ValueError("bad shape\n  at layer 3"), "bad shape"),
    (ValueError("\n\n  second line first  \nthird"), "second line first"),
    (ValueError(), "ValueError"),
    (OSError(""), "OSError"),
    (KeyError(), "KeyError"),
    (RuntimeError("x" * 300), "x" * 200),
])
def test_first_line_is_the_first_non_empty_line_or_the_class_name(err, expected):
    assert first_line(err) == expected


def test_first_line_honours_its_limit():
    assert first_line(ValueError("abcdef"), limit=3) == "abc"


def raiser(err: BaseException):
    def fail(*args, **kwargs):
        raise err
    return fail


@pytest.mark.parametrize("zoo", ["torchvision", "timm"])
def test_a_zoo_that_fails_without_a_message_is_one_line(monkeypatch, zoo):
    from hvdtrain.models.zoo import from_zoo

    fake = types.SimpleNamespace(models=types.SimpleNamespace(get_model=raiser(ValueError())),
                                 create_model=raiser(KeyError()))
    monkeypatch.setitem(sys.modules, zoo, fake)
    with pytest.raises(UserError) as err:
        from_zoo(f"{zoo}:nonet", (3, 32, 32), 10)
    assert one_line(err) == f"{zoo} has no model 'nonet' ({'ValueError' if zoo == 'torchvision' else 'KeyError'})"


def test_a_parquet_footer_that_fails_without_a_message_is_one_line(monkeypatch):
    from hvdtrain.data import streaming

    monkeypatch.setattr(streaming, "open_parquet", raiser(OSError()))
    with pytest.raises(UserError) as err:
        streaming.row_groups(["part-0.parquet"])
    assert one_line(err) == "cannot read part-0.parquet as Parquet: OSError"


def test_a_csv_that_fails_without_a_message_is_one_line(monkeypatch, tmp_path):
    import pyarrow.csv

    from hvdtrain.data.tabular import read_table

    table = tmp_path / "rows.csv"
    table.write_text("a,b\n1,2\n")
    monkeypatch.setattr(pyarrow.csv, "read_csv", raiser(OSError()))
    with pytest.raises(UserError) as err:
        read_table(str(table))
    assert one_line(err) == f"cannot read {table} as CSV: OSError"


def test_a_store_filesystem_that_fails_without_a_message_is_one_line(monkeypatch):
    import fsspec.core
    import pyarrow.fs as pafs

    from hvdtrain.spark.store import filesystem_of

    monkeypatch.setattr(pafs, "FileSystem", types.SimpleNamespace(from_uri=raiser(OSError())))
    monkeypatch.setattr(fsspec.core, "url_to_fs", raiser(ValueError("protocol not known")))
    with pytest.raises(UserError) as err:
        filesystem_of("nofs://bucket/store")
    assert one_line(err).startswith("cannot open store nofs://bucket/store: OSError; use a local or shared path")


def test_a_checkpoint_torch_cannot_load_without_a_message_is_one_line(monkeypatch, tmp_path):
    import torch

    from hvdtrain.checkpoint import format as checkpoint

    bad = tmp_path / "ckpt-000000001.pt"
    bad.write_bytes(b"not a checkpoint")
    monkeypatch.setattr(torch, "load", raiser(RuntimeError()))
    with pytest.raises(UserError) as err:
        checkpoint.load(bad)
    assert one_line(err) == f"{bad} is not a readable hvdtrain checkpoint (RuntimeError)"


def test_a_step_that_fails_without_a_message_is_one_line():
    import torch

    from hvdtrain.train.step import check_step

    def step(model, batch):
        raise ValueError()

    with pytest.raises(UserError) as err:
        check_step(torch.nn.Linear(2, 2), (torch.zeros(2, 2), torch.zeros(2, dtype=torch.long)),
                   torch.nn.functional.cross_entropy, step)
    assert one_line(err).startswith("step_fn failed on a batch of tuple(Tensor[2, 2], Tensor[2]): ValueError")
