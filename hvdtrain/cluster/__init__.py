"""Hosts: hostfiles and the allocations of Slurm, PBS/Torque and LSF, in the forms horovodrun reads."""
