"""What the Spark test modules share: the Java check and a local[2] session bound to loopback."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


needs_java = pytest.mark.skipif(_java() is None, reason="Spark 4 needs Java 17/21 (java on PATH or JAVA_HOME); "
                                                        "none found, so the Spark tests cannot run here")
SPARK_ENV = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}


def local_session(name: str):
    """A local[2] session (a JVM start costs seconds: one per test module); the caller stops it."""
    from pyspark.sql import SparkSession

    saved = dict(os.environ)
    os.environ.update(SPARK_ENV)  # read when the JVM and the context start
    try:
        return (SparkSession.builder.master("local[2]").appName(name)
                .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                .getOrCreate())
    finally:
        os.environ.clear()
        os.environ.update(saved)
