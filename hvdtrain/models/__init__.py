"""Models: the built-ins and the model-parallel split into stages. Model code never imports Horovod."""
