"""The quickstart notebook, executed top to bottom by a real Jupyter kernel."""
from __future__ import annotations

import re

import nbformat
from nbclient import NotebookClient
from support.paths import ROOT

NOTEBOOK = ROOT / "examples" / "notebooks" / "quickstart.ipynb"


def executed_text(name: str, tmp_path) -> str:
    """examples/notebooks/NAME.ipynb run top to bottom in a real kernel (working folder tmp_path): the text
    its code cells printed, in order."""
    nb = nbformat.read(ROOT / "examples" / "notebooks" / f"{name}.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)


def test_notebooks_are_stored_without_outputs():
    for path in sorted((ROOT / "examples" / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, path


def test_quickstart_runs_in_a_real_kernel_and_reaches_the_target(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    last = "".join(out.get("text", "") for out in nb.cells[-1].outputs)
    match = re.search(r"held-out accuracy on 2 workers: ([0-9.]+)", last)
    assert match, last
    assert float(match.group(1)) >= 0.9   # a threshold: the accuracy the notebook prints is what its user sees
    first = "".join(out.get("text", "") for out in nb.cells[1].outputs)
    assert "val_acc" in first  # the in-process run printed its per-epoch table
    plots = [out for out in nb.cells[-2].outputs if "image/png" in out.get("data", {})]
    assert plots, "history.plot() drew no figure"


def test_your_own_model_notebook_trains_an_image_folder_and_dict_batches(tmp_path):
    text = executed_text("your_own_model", tmp_path)
    images = re.search(r"images: held-out accuracy ([0-9.]+)", text)
    batches = re.search(r"dict batches: held-out accuracy ([0-9.]+)", text)
    assert images and batches, text[-2000:]
    # Thresholds: the accuracies the notebook prints are what its user sees.
    assert float(images.group(1)) >= 0.6 and float(batches.group(1)) >= 0.8


def test_hugging_face_notebook_fine_tunes_bert_with_a_padding_collate_on_two_workers(tmp_path):
    text = executed_text("hugging_face", tmp_path)
    accuracy = re.search(r"hugging face: held-out accuracy on 2 workers: ([0-9.]+)", text)
    # A threshold: the accuracy the notebook prints is what its user sees.
    assert accuracy and float(accuracy.group(1)) >= 0.9, text[-2000:]
    assert "'hf'" in text and "'model.safetensors'" in text
    reloaded = re.search(r"predictions (\[.*?\]) labels (\[.*?\])", text)
    assert reloaded and reloaded.group(1) == reloaded.group(2), text[-1000:]   # the saved model is the trained one
