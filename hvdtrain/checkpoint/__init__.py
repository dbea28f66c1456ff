"""Checkpoints, one home: the file format (format.py), the stateful protocol every saved component speaks
(stateful.py), the random streams' state (rng_state.py), reading one back to resume (resume.py) and the manager
that decides when to write and what (manager.py). Below train/: it knows no component of the Trainer's."""
