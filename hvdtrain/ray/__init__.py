"""Train on a Ray cluster: `hvdtrain.ray.fit(config_or_fn, num_workers=N)`, N Horovod workers in N Ray actors.

Named after Ray; inside this package `import ray` is absolute (from __future__ annotations and Python 3's
absolute imports), so it finds the Ray library, never this package.
"""
from hvdtrain.ray.ray_fit import fit

__all__ = ["fit"]
