"""Datasets (built-in and plug-in), which samples each rank trains on, and the DataLoader."""
