"""--max-grad-norm's config: a non-negative float, and refused in one line with --op adasum (Adasum steps inside
backward on each rank's own gradients: there is no averaged gradient to clip). The clipping itself is checked
on real workers in tests/multirank/test_clipping_multirank.py."""
from __future__ import annotations

import subprocess
import sys

import pytest
from support.paths import ROOT

from hvdtrain.config.train_config import load_config
from hvdtrain.errors import ConfigError


def test_max_grad_norm_is_off_by_default_and_read_from_the_command_line():
    assert load_config(None, []).max_grad_norm == 0.0
    assert load_config(None, ["--max-grad-norm", "0.5"]).max_grad_norm == 0.5
    with pytest.raises(ConfigError, match="max_grad_norm must be >= 0, got -1.0"):
        load_config(None, ["--max-grad-norm", "-1"])


def test_adasum_with_max_grad_norm_is_refused_naming_both_and_the_fix():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["--op", "adasum", "--lr-scaling", "none", "--max-grad-norm", "1"])
    text = str(err.value)
    assert "\n" not in text and "max_grad_norm" in text and "adasum" in text, text
    assert "drop --max-grad-norm or use --op average" in text, text
    assert load_config(None, ["--op", "adasum", "--lr-scaling", "none"]).max_grad_norm == 0.0   # off: accepted


def test_the_cli_refuses_it_in_one_line_before_training():
    proc = subprocess.run([sys.executable, "-m", "hvdtrain", "--op", "adasum", "--lr-scaling", "none",
                           "--max-grad-norm", "1", "--run-dir", ""], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "max_grad_norm cannot be combined with op adasum" in lines[0], proc.stderr
