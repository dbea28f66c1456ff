"""What the tests share, one module per concept, imported as `support.<module>` (tests/ is on sys.path: pytest puts
the folder of the rootdir conftest there, and tests/conftest.py only wires fixtures, hooks and plugins).

- paths: the checkout, the venv's bin/, the plug-ins folder and the environment that puts it on PYTHONPATH
- processes: horovodrun for real, killing a launcher's whole family, a process's output for assertion messages
- runs: what a finished run left (metrics.jsonl records, final weights) and the shared reference jobs
- environ, ordering: the conftest's environment guard and test order, kept testable
- waiting: the one polling wait; timeline, allreduce_count: instrumentation of what went over the wire
- netns_cluster, slurm_cluster, ray_cluster, spark_session: real clusters on this machine
- s3_server: a real S3 server on loopback (moto's, from its own virtualenv) for the object-store path
- worker_fns, control_attacker: code run by workers, and a script run against a job from outside it
"""
