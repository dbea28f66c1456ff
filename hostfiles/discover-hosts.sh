#!/usr/bin/env bash
# Elastic Horovod host discovery: print `host:slots` lines for the hosts now available.
#
#   HVDTRAIN_HOSTS_FILE=/shared/hosts.txt horovodrun -np 4 --min-np 2 --max-np 8 \
#       --host-discovery-script hostfiles/discover-hosts.sh python train.py
#
# horovodrun runs this every few seconds. Edit the file (same formats as `hvdtrain hosts check`:
# `host`, `host slots=N`, `host:N`, `#` comments, blank lines) to add or remove hosts while the job
# runs; replace it atomically (write a copy, then mv) so a half-written file is never read.
# train.py stands for an elastic training script (hvd.elastic.run); see hostfiles/README.md.
set -euo pipefail
file="${HVDTRAIN_HOSTS_FILE:?set HVDTRAIN_HOSTS_FILE to the hostfile to watch}"
[ -r "$file" ] || { echo "discover-hosts.sh: cannot read $file" >&2; exit 1; }
# Awk, not python: this runs every few seconds on the launcher, in whatever PATH horovodrun has.
awk '
    { sub(/#.*/, "") }
    NF == 0 { next }
    NF == 1 && $1 ~ /^[^:]+:[1-9][0-9]*$/ { print $1; next }
    NF == 1 && !index($1, ":") { print $1 ":1"; next }
    NF == 2 && $2 ~ /^slots=[1-9][0-9]*$/ { sub(/^slots=/, "", $2); print $1 ":" $2; next }
    { printf "discover-hosts.sh: %s line %d: '\''%s'\'' — expected host, host slots=N or host:N\n", FILENAME, FNR, $0 > "/dev/stderr"; bad = 1; exit 1 }
    END { exit bad }
' "$file"
