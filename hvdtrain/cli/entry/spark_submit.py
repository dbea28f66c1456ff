"""`spark-submit ... hvdtrain/cli/entry/spark_submit.py [--num-proc N] [--config FILE] [--key value ...]`:

    spark-submit --master spark://HOST:7077 --conf spark.task.cpus=2 \\
        $(python -c 'import hvdtrain.cli.entry.spark_submit as m; print(m.__file__)') --num-proc 4 --epochs 5

The same as `hvdtrain spark ...`.
"""
import sys

from hvdtrain.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["spark", *sys.argv[1:]]))
