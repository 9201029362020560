"""Experiment configs (`ml_collections.ConfigDict`), one `get_config()` per file."""
