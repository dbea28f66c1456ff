"""Start Horovod workers from Python (horovodrun under the hood) and bring their results back."""
