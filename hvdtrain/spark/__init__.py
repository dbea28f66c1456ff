"""Train on Apache Spark: `hvdtrain.spark.fit(config_or_fn, num_proc=N)`, N Horovod workers in N Spark tasks."""
from hvdtrain.spark.spark_fit import fit, local_slots

__all__ = ["fit", "local_slots"]
