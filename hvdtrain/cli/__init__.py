"""The `hvdtrain` command: train, predict, doctor, hosts, spark. Each subcommand is one module."""
