"""The `hvdtrain` command: train (the default), predict, compress, tune, doctor, hosts, spark, ray and
launch. Each subcommand is one module here; main.py lists them in SUBCOMMANDS."""
