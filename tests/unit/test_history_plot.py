"""History.plot: the run's curves.png is drawn without touching the caller's matplotlib backend or pyplot."""
import subprocess
import sys

from matplotlib.image import imread

from hvdtrain.output.history import History

EPOCHS = [{"epoch": 0, "train_loss": 1.2, "val_loss": 1.0, "train_acc": 0.5, "val_acc": 0.6},
          {"epoch": 1, "train_loss": 0.7, "val_loss": 0.8, "train_acc": 0.8, "val_acc": 0.75}]


def test_saving_the_curves_draws_both_panels_and_leaves_the_backend_and_pyplot_alone(tmp_path):
    # A fresh interpreter: pyplot may already be imported in this one. The backend asked for before the plot
    # (a user's interactive choice) is still the backend after it; the PNG decodes with both panels' width.
    script = f"""
import sys, matplotlib
matplotlib.use("svg")
from hvdtrain.output.history import History
fig = History({EPOCHS!r}).plot({str(tmp_path / "curves.png")!r})
print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules, "IPython" in sys.modules, len(fig.axes),
      len(fig.axes[0].lines))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # Nor is IPython imported just to ask whether this is a notebook (a kernel has it imported already).
    assert out.stdout.split() == ["svg", "False", "False", "2", "2"]
    height, width, _ = imread(tmp_path / "curves.png").shape
    assert (width, height) == (1000, 380)


def test_without_a_path_the_figure_is_pyplots_to_show():
    import matplotlib.pyplot as plt

    fig = History(EPOCHS).plot()
    try:
        assert plt.fignum_exists(fig.number) and [ax.get_title() for ax in fig.axes] == ["loss", "accuracy"]
    finally:
        plt.close(fig)
