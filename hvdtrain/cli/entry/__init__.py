"""The file spark-submit runs (spark-submit takes a .py file, not a module). Alone in its folder on
purpose: the script's folder goes first on sys.path, and nothing here can shadow another module."""
