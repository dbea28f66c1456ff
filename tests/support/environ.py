"""What conftest's restore_environ fixture ignores and how it reports a leak (a test checks the same set)."""
from __future__ import annotations

# pytest's own variable, changed by it between phases: not a test's leak.
PYTEST_OWN = "PYTEST_CURRENT_TEST"
# Set by libraries in their own process the first time they are used (torch's inductor cache and its compiled
# code's tensor pointer, Intel OpenMP at import, MLflow's telemetry session): restored like any other, but not
# reported, since no test can avoid them.
LIBRARY_SET = {"TORCHINDUCTOR_CACHE_DIR", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "KMP_DUPLICATE_LIB_OK",
               "KMP_INIT_AT_FORK", "_MLFLOW_TELEMETRY_SESSION_ID"}


class EnvironmentLeak(UserWarning):
    """A test changed os.environ and did not undo it (restored by the restore_environ fixture)."""
