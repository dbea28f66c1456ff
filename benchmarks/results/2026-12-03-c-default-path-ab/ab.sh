#!/bin/bash
# alternate old (603c2c7) and new (main) hvdtrain default path, benchmarks.worker, best/median ms
out=/tmp/ab.jsonl; : > $out
for round in 1 2 3; do
  for model in mlp cnn; do
    for v in old new; do
      dir=/tmp/old; [ $v = new ] && dir=/work/main
      (cd $dir && PYTHONPATH=$dir timeout 300 /work/main/.venv/bin/python -m benchmarks.worker --variant hvdtrain --model $model --steps 30 --result /tmp/ab1.json >/dev/null 2>&1) && python3 -c "import json;d=json.load(open('/tmp/ab1.json'));print(json.dumps({'v':'$v','np':1,'model':'$model','best':d['best_ms'],'median':d['median_ms']}))" >> $out
      (cd $dir && PYTHONPATH=$dir timeout 300 /work/main/.venv/bin/horovodrun -np 2 -H localhost:2 --gloo --network-interfaces lo /work/main/.venv/bin/python -m benchmarks.worker --variant hvdtrain --launcher horovodrun --model $model --steps 30 --result /tmp/ab2.json >/dev/null 2>&1) && python3 -c "import json;d=json.load(open('/tmp/ab2.json'));print(json.dumps({'v':'$v','np':2,'model':'$model','best':d['best_ms'],'median':d['median_ms']}))" >> $out
    done
  done
done
