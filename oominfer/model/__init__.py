"""The model: its config.json read into a ModelSpec.

Sources, in order: a local folder, the Hugging Face cache, the built-in catalog, the Hub.
"""
