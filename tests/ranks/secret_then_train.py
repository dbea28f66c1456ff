"""Rank-side: train with the given hvdtrain arguments (main() loads HVDTRAIN_SECRETS_FILE first), then
record what this worker received as $WATCHED_NAME: a digest, so this file never holds the value."""
import hashlib
import json
import os
import sys

from hvdtrain.cli.main import main

code = main(sys.argv[1:])
value = os.environ.get(os.environ["WATCHED_NAME"])
seen = {"rank": os.environ.get("HOROVOD_RANK"), "host": os.uname().nodename,
        "sha256": hashlib.sha256(value.encode()).hexdigest() if value is not None else None}
with open(os.path.join(os.environ["SEEN_DIR"], f"rank-{seen['rank']}.json"), "w") as file:
    json.dump(seen, file)
sys.exit(code)
