"""A test dataset plug-in for elastic joins: the probe's indexed digits, loaded slowly on one host (the
worker that joins a running job), which records how long its loading took."""
import json
import os
import time

from elastic_probe import indexed_digits


def slow_on_joiner(config):
    began = time.time()
    if os.environ.get("HOROVOD_HOSTNAME") == os.environ["SLOW_JOIN_HOST"]:
        time.sleep(float(os.environ["SLOW_JOIN_S"]))
    data = indexed_digits(config)
    with open(os.environ["SLOW_JOIN_LOG"], "a") as handle:
        handle.write(json.dumps({"host": os.environ.get("HOROVOD_HOSTNAME"), "pid": os.getpid(),
                                 "load_s": time.time() - began}) + "\n")
    return data
