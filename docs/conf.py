"""Sphinx configuration of the hvdtrain docs: `make docs` builds docs/_build/html with warnings as errors.

docs/_ext/hvdtrain_docs.py checks every flag the pages name and generates the TrainConfig table and the
error catalog from the code.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "_ext"), str(HERE.parent)]  # the extension, and hvdtrain for autodoc

project = "hvdtrain"
author = "hvdtrain contributors"
copyright = "hvdtrain contributors"  # noqa: A001 (Sphinx's name)

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "hvdtrain_docs"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext", "README.md"]
root_doc = "index"

# Links to headings ([text](page.md#heading)) resolve through generated anchors; a missing one warns.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]
suppress_warnings: list[str] = []

# The API reference: docstrings (Args/Returns/Example, Google style) of the public API.
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_mock_imports = ["horovod"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# "Returns:" holds prose here ("Rank 0's return value (...)"), not "type: description": render it as text.
napoleon_custom_sections = [("Returns", "returns_as_prose")]
nitpicky = True
# Types from other libraries (no intersphinx: the build must work offline).
nitpick_ignore_regex = [(r"py:.*", r"(torch|numpy|np|optuna|pyspark|pandas|pyarrow|datasets|collections|typing|"
                                   r"argparse|pathlib|os|concurrent)(\..*)?"),
                        (r"py:.*", r"(Any|Callable|Iterable|Iterator|Sequence|Mapping|Path|Module|Tensor|Dataset|"
                                   r"DataLoader|DataFrame|SparkSession|optional|callable)")]

html_theme = "furo"
html_title = "hvdtrain"
