"""Faster implementations of the model's computations, registered by name (the model files never import them)."""
