"""The one training config (a typed, validated dataclass), how it is read, and plug-in names."""
